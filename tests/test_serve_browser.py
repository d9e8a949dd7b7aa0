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
