"""serve.py's chat page in a real headless browser (Chromium and its driver from the
system's packages, through Selenium): two turns typed, both replies streamed in and
equal to the API's temperature-0 replies for the same conversation; Stop ends a third."""

import shutil

import pytest
from serve_helpers import Server, post, write_checkpoint

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-test.txt)")

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "chromium-driver")


def find(names):
    return next((path for path in map(shutil.which, names) if path), None)


@pytest.fixture(scope="module")
def browser():
    binary, driver = find(BROWSERS), find(DRIVERS)
    if binary is None or driver is None:
        pytest.skip("no Chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    b = webdriver.Chrome(service=Service(driver), options=options)
    yield b
    b.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(f"--ckpt={write_checkpoint(tmp_path_factory.mktemp('page') / 'chat.pt')}",
               env={"GPT_FAULTS": "token_delay=0.03"})  # 30 ms a token: the page is seen mid-reply
    yield s
    s.stop()


def api_reply(server, messages):
    status, reply = post(server.url + "/v1/chat/completions",
                         {"messages": messages, "temperature": 0, "max_tokens": 16})
    assert status == 200, reply
    return reply["choices"][0]["message"]["content"]


def test_two_turns_on_the_page_stream_in_and_equal_the_api(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 30, poll_frequency=0.05)
    wait.until(lambda b: server.name in b.find_element(By.ID, "status").text)  # /v1/models answered
    browser.execute_script("document.querySelector('details').open = true")
    for field, value in (("temperature", "0"), ("max_tokens", "16"), ("system", "be kind.")):
        element = browser.find_element(By.ID, field)
        element.clear()
        element.send_keys(value)
    messages = [{"role": "system", "content": "be kind."}]
    for turn, text in enumerate(["hello there", "and then"], 1):
        browser.find_element(By.ID, "input").send_keys(text, Keys.ENTER)
        partial = wait.until(lambda b: "".join(e.text for e in b.find_elements(By.CSS_SELECTOR, ".assistant[data-streaming]")))
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".assistant[data-done]")) == turn)
        shown = browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1].text
        messages.append({"role": "user", "content": text})
        expected = api_reply(server, messages)
        assert shown == expected.strip() and expected  # the page's reply, the whole conversation sent
        assert expected.startswith(partial) and len(partial) < len(expected)  # it came in piece by piece
        messages.append({"role": "assistant", "content": expected})
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".user")] == ["hello there", "and then"]
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")
    browser.find_element(By.ID, "input").send_keys("stop soon", Keys.ENTER)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-streaming]")[0].text)
    browser.find_element(By.ID, "stop").click()
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".assistant[data-done]")) == 3)
    cut = browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1].text
    full = api_reply(server, messages + [{"role": "user", "content": "stop soon"}])
    assert full.startswith(cut) and len(cut) < len(full.strip())
    assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_elements(By.CSS_SELECTOR, ".error")


def api_usage(server, messages):
    status, reply = post(server.url + "/v1/chat/completions",
                         {"messages": messages, "temperature": 0, "max_tokens": 16})
    assert status == 200, reply
    return reply["choices"][0]["message"]["content"], reply["usage"]


def test_history_survives_a_reload_replies_regenerate_and_edits_resend(browser, server):
    """After the first test's three turns: a reload shows them again (localStorage), New
    chat clears them for good; a reply shows its token counts; Regenerate replaces the last
    reply; Edit on a user message resends the conversation up to it with the new text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, poll_frequency=0.05)

    def texts(selector):
        return [e.text for e in browser.find_elements(By.CSS_SELECTOR, selector)]

    def settle(turns):
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".assistant[data-done]")) == turns
                   and not b.find_elements(By.CSS_SELECTOR, "[data-streaming]")
                   and b.find_element(By.ID, "send").is_enabled())

    before = texts(".user"), texts(".assistant")
    browser.refresh()
    wait.until(lambda b: server.name in b.find_element(By.ID, "status").text)
    assert (texts(".user"), texts(".assistant")) == before and len(before[0]) == 3
    browser.find_element(By.ID, "clear").click()
    browser.refresh()
    wait.until(lambda b: server.name in b.find_element(By.ID, "status").text)
    assert texts(".msg") == []  # cleared, and still cleared after a reload
    browser.execute_script("document.querySelector('details').open = true")
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")
    browser.find_element(By.ID, "max_tokens").send_keys("16")
    browser.find_element(By.ID, "input").send_keys("hello there", Keys.ENTER)
    settle(1)
    first, usage = api_usage(server, [{"role": "user", "content": "hello there"}])
    assert texts(".assistant") == [first.strip()]
    (stats,) = texts(".stats")
    assert stats.startswith(f"{usage['prompt_tokens']} prompt tokens · {usage['completion_tokens']} reply tokens · ")
    assert float(stats.split(" · ")[2].split()[0]) > 0  # tokens/s
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("1.5")  # regenerated at another temperature: it differs
    browser.find_element(By.CSS_SELECTOR, ".regenerate").click()
    settle(1)
    assert texts(".user") == ["hello there"] and len(texts(".assistant")) == 1
    regenerated = texts(".assistant")[0]
    assert regenerated != first.strip()
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")
    browser.find_element(By.ID, "input").send_keys("and then", Keys.ENTER)
    settle(2)
    assert texts(".user") == ["hello there", "and then"]
    browser.find_elements(By.CSS_SELECTOR, ".edit")[0].click()  # the first message, edited and sent again
    editor = browser.find_element(By.CSS_SELECTOR, ".editor")
    editor.clear()
    editor.send_keys("what is new")
    browser.find_element(By.CSS_SELECTOR, ".resend").click()
    settle(1)
    edited, _ = api_usage(server, [{"role": "user", "content": "what is new"}])
    assert texts(".user") == ["what is new"] and texts(".assistant") == [edited.strip()]
    browser.refresh()
    wait.until(lambda b: server.name in b.find_element(By.ID, "status").text)
    assert texts(".user") == ["what is new"] and texts(".assistant") == [edited.strip()]
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")


def test_an_empty_reply_stays_a_turn_with_its_figures(browser, server):
    """A reply the server ended before any text (here max_tokens 0; at a high temperature,
    a stop token drawn first) keeps its turn: the user's message stays, with an empty reply
    and its token counts, where a page that dropped it lost the message (and Regenerate's
    wait for a reply never ended)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, poll_frequency=0.05)
    browser.find_element(By.ID, "clear").click()
    browser.execute_script("document.querySelector('details').open = true")
    browser.find_element(By.ID, "max_tokens").clear()
    browser.find_element(By.ID, "max_tokens").send_keys("0")
    browser.find_element(By.ID, "input").send_keys("hello there", Keys.ENTER)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-done]")
               and b.find_element(By.ID, "send").is_enabled())
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".user")] == ["hello there"]
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".assistant")] == [""]
    (stats,) = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".stats")]
    assert " prompt tokens · 0 reply tokens · " in stats
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")
