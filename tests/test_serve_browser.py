"""serve.py's chat page in a real headless browser (Chromium and its driver from the
system's packages, through Selenium): two turns typed, both replies streamed in and
equal to the API's temperature-0 replies for the same conversation; Stop ends a third.
Then the page against a stand-in server that fails on cue (StandIn): whatever fails,
the user's words are never lost and nothing half-made is kept."""

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from repo import REPO
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


# --- the page against a server that fails on cue -------------------------------------------

FAILURES = {  # StandIn's modes: how a reply fails, as the page sees it
    "down": "the connection closes with no answer (as a server that is down or gone)",
    "400": "a 4xx answer in OpenAI's error shape",
    "500": "a 5xx answer in OpenAI's error shape",
    "error": "200, some text, then an error event and [DONE] (serve.py's way to fail mid-stream)",
    "cut": "200, some text, then the connection closes mid-body (a server killed mid-reply)",
    "short": "200, some text, then a clean end with no [DONE] (a proxy that gave up)",
}


class StandIn(ThreadingHTTPServer):
    """The page, /v1/models and a /v1/chat/completions that streams "reply K to TEXT"
    (K counts the requests, TEXT the last user message) or fails as `mode` says (FAILURES).
    `requests` keeps every chat request's body; `delay` is the wait before each piece."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), StandInHandler)
        self.mode, self.delay, self.requests = "ok", 0.0, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class StandInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/":
            return self.answer(200, (REPO / "gptkit/serve/page.html").read_bytes(), "text/html")
        self.answer(200, {"object": "list", "data": [{"id": "stand-in", "object": "model", "chat": True}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        server.requests.append(body)
        mode = server.mode
        if mode == "down":
            self.close_connection = True
            return
        if mode in ("400", "500"):
            return self.answer(int(mode), {"error": {"message": f"stand-in failure {mode}", "type": "x",
                                                     "param": None, "code": None}})
        reply = f"reply {len(server.requests)} to {body['messages'][-1]['content']}"
        pieces = [reply[i:i + 4] for i in range(0, len(reply), 4)]
        events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
        if mode != "ok":  # the failing modes send some of the text first
            events = events[:2]
        if mode == "error":
            events.append({"error": {"message": "stand-in failure mid-stream", "type": "server_error"}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if mode == "short":
            self.send_header("Connection", "close")  # no length, not chunked: the body ends where it closes
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        write = self.wfile.write if mode == "short" else \
            (lambda data: self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data)))
        done = [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces)}}, "[DONE]"]
        try:
            for event in events + (done if mode in ("ok", "error") else []):
                time.sleep(server.delay)
                text = event if isinstance(event, str) else json.dumps(event)
                write(f"data: {text}\n\n".encode())
                self.wfile.flush()
            if mode in ("ok", "error"):
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the page left (Stop, New chat, a reload)
        self.close_connection = mode != "ok"


@pytest.fixture(scope="module")
def stand_in():
    s = StandIn()
    yield s
    s.shutdown()


class Page:
    """The page in the browser, as a user sees it."""

    def __init__(self, browser, url):
        from selenium.webdriver.support.ui import WebDriverWait

        self.b, self.url = browser, url
        self.wait = WebDriverWait(browser, 20, poll_frequency=0.05)

    def open(self, fresh=True):
        self.b.get(self.url + "/")
        if fresh:
            self.b.execute_script("localStorage.clear()")
            self.b.refresh()
        self.wait.until(lambda b: "stand-in" in self.by_id("status").text)

    def by_id(self, name):
        from selenium.webdriver.common.by import By

        return self.b.find_element(By.ID, name)

    def all(self, selector):
        from selenium.webdriver.common.by import By

        return self.b.find_elements(By.CSS_SELECTOR, selector)

    def texts(self, selector=".user, .assistant"):
        return [e.text for e in self.all(selector)]

    def saved(self):
        return json.loads(self.b.execute_script("return localStorage.getItem('gptkit-chat')") or "[]")

    def box(self):
        return self.by_id("input").get_attribute("value")

    def type(self, text):
        from selenium.webdriver.common.keys import Keys

        self.by_id("input").send_keys(text, Keys.ENTER)

    def settled(self):
        """Wait until no reply is on its way and Send is back."""
        self.wait.until(lambda b: not self.all("[data-streaming]") and self.by_id("send").is_enabled())

    def streaming(self):
        """Wait until a reply's first text is in."""
        self.wait.until(lambda b: any(e.text for e in self.all("[data-streaming]")))


def conversation_of(page):
    return [(m["role"], m["content"]) for m in page.saved()]


@pytest.mark.parametrize("mode", FAILURES)
def test_a_failed_send_regenerate_or_edit_loses_nothing_the_user_wrote(browser, stand_in, mode):
    """Send, Regenerate and Edit against each failure: the conversation (shown and saved) is
    as it was, an error says why, and the words are back where they were typed: the box,
    or the editor. Then, the server answering again, they go out as typed."""
    page = Page(browser, stand_in.url)
    stand_in.mode, stand_in.delay = "ok", 0.0
    page.open()
    page.type("first words")
    page.settled()
    before = page.texts(), conversation_of(page)
    assert before[0] == ["first words", f"reply {len(stand_in.requests)} to first words"]

    stand_in.mode = mode
    page.type("lost words?")
    page.settled()
    assert (page.texts(), conversation_of(page)) == before and page.box() == "lost words?"
    assert len(page.all(".error")) == 1 and page.all(".error")[0].text

    page.all(".regenerate")[0].click()
    page.settled()
    assert (page.texts(), conversation_of(page)) == before and page.box() == "lost words?"
    assert len(page.all(".error")) == 1

    page.all(".edit")[0].click()
    editor = page.all(".editor")[0]
    editor.clear()
    editor.send_keys("edited words")
    page.all(".resend")[0].click()
    page.settled()
    assert page.all(".editor")[0].get_attribute("value") == "edited words"  # the editor is back, words in it
    assert conversation_of(page) == before[1] and page.texts() == before[0][1:] and page.all(".error")

    stand_in.mode = "ok"
    page.all(".resend")[0].click()
    page.settled()
    assert page.texts() == ["edited words", f"reply {len(stand_in.requests)} to edited words"]
    assert [m["role"] for m in stand_in.requests[-1]["messages"]] == ["user"]
    page.by_id("send").click()  # the box's words, kept all along
    page.settled()
    assert page.texts()[2:] == ["lost words?", f"reply {len(stand_in.requests)} to lost words?"]
    assert page.box() == "" and not page.all(".error")


def test_stop_before_any_text_puts_the_words_back_and_after_text_keeps_the_part(browser, stand_in):
    page = Page(browser, stand_in.url)
    stand_in.mode, stand_in.delay = "ok", 0.0
    page.open()
    stand_in.delay = 1.0  # the first piece comes a second after the request
    page.type("wait for it")
    page.wait.until(lambda b: page.by_id("stop").is_enabled())
    page.by_id("input").send_keys("typed meanwhile")
    page.by_id("stop").click()
    page.settled()
    assert page.texts() == [] and conversation_of(page) == [] and not page.all(".error")
    assert page.box() == "wait for it\n\ntyped meanwhile"  # both kept, the words that went out first
    page.by_id("input").clear()
    page.by_id("input").send_keys("wait for it")
    stand_in.delay = 0.3
    page.by_id("send").click()
    page.streaming()
    page.by_id("stop").click()
    page.settled()
    user, cut = page.texts()
    assert user == "wait for it" and cut and f"reply {len(stand_in.requests)} to wait for it".startswith(cut)
    assert page.box() == "" and conversation_of(page)[1] == ("assistant", cut)


def test_new_chat_during_a_reply_cuts_it_and_nothing_of_it_reaches_the_new_conversation(browser, stand_in):
    page = Page(browser, stand_in.url)
    stand_in.mode, stand_in.delay = "ok", 0.0
    page.open()
    page.type("old chat")
    page.settled()
    stand_in.delay = 0.2
    page.type("a long reply please")
    page.streaming()
    page.by_id("clear").click()
    assert page.texts() == [] and conversation_of(page) == [] and page.by_id("send").is_enabled()
    time.sleep(1.0)  # long enough for the cut reply to have ended had it not been cut
    assert page.texts() == [] and conversation_of(page) == [] and not page.all(".error")
    stand_in.delay = 0.0
    page.type("new chat")
    page.settled()
    assert stand_in.requests[-1]["messages"] == [{"role": "user", "content": "new chat"}]
    assert page.texts() == ["new chat", f"reply {len(stand_in.requests)} to new chat"]
    assert conversation_of(page) == [("user", "new chat"), ("assistant", page.texts()[1])]


def test_a_reload_mid_reply_puts_the_unanswered_message_back_in_the_box(browser, stand_in):
    """Never two user turns in a row: the message whose reply a reload cut comes back in the
    box (and the box's text survives reloads), the conversation before it stays."""
    page = Page(browser, stand_in.url)
    stand_in.mode, stand_in.delay = "ok", 0.0
    page.open()
    page.type("hello")
    page.settled()
    before = page.texts()
    stand_in.delay = 0.2
    page.type("cut by a reload")
    page.streaming()
    page.open(fresh=False)
    assert page.texts() == before and page.box() == "cut by a reload"
    page.open(fresh=False)  # reloaded again: still there
    assert page.texts() == before and page.box() == "cut by a reload"
    stand_in.delay = 0.0
    page.by_id("send").click()
    page.settled()
    roles = [m["role"] for m in stand_in.requests[-1]["messages"]]
    assert roles == ["user", "assistant", "user"] and page.texts()[2] == "cut by a reload"
    assert [r for r, _ in conversation_of(page)] == ["user", "assistant", "user", "assistant"]


def test_an_open_editor_keeps_its_words_while_other_replies_come_and_go(browser, stand_in):
    """An edit not sent yet stays open, with its text, through a new message and a
    Regenerate; when an earlier message is edited and sent, its message is gone and its
    words go to the box."""
    page = Page(browser, stand_in.url)
    stand_in.mode, stand_in.delay = "ok", 0.0
    page.open()
    for text in ("one", "two"):
        page.type(text)
        page.settled()
    page.all(".edit")[1].click()
    page.all(".editor")[0].clear()
    page.all(".editor")[0].send_keys("two, edited")
    page.type("three")
    page.settled()
    assert [e.get_attribute("value") for e in page.all(".editor")] == ["two, edited"]
    assert page.texts(".user") == ["one", "three"] and len(page.texts(".assistant")) == 3
    page.all(".regenerate")[0].click()
    page.settled()
    assert [e.get_attribute("value") for e in page.all(".editor")] == ["two, edited"]
    page.all(".edit")[0].click()
    page.all(".editor")[0].clear()
    page.all(".editor")[0].send_keys("one, edited")
    page.all(".resend")[0].click()
    page.settled()
    assert page.texts(".user") == ["one, edited"] and not page.all(".editor")
    assert page.box() == "two, edited" and not page.all(".error")
