"""A model that calls the calculator mid-reply: trained here on replies that call it with
"12*34", then go on with "ok" after its output. sample.py --chat's loop
(gptkit/generation/chat_session.py) and serve.py's batch rows (gptkit/serve/batch.py)
run the call and force its output in; a row's call never changes another row's reply."""

import dataclasses
import json
import random

import pytest
import torch
from repo import REPO
from serve_helpers import Server, post
from test_serve import post_stream
from test_serve_batch import BASE, alone, collect, texts
from train_helpers import tiny_args

import train
from gptkit.data.chat import marked_reply_messages, prompt_ids, special_ids
from gptkit.generation import chat_session
from gptkit.models.loading import load_model
from gptkit.prepare.chat import prepare_chat
from gptkit.serve.worker import Job, Worker

LETTERS = "abcdefghijklmnopqrstuvwxyz "
CALLED = "<|call|>12*34<|/call|><|output|>408<|/output|>ok"  # the reply as its text shows it
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The out_dir of a model trained on noisy questions each answered by the same calculator call."""
    tmp = tmp_path_factory.mktemp("tools")
    r = random.Random(0)
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": "12*34"})}}
    lines = []
    for _ in range(200):
        noise = "".join(r.choice(LETTERS) for _ in range(r.randint(5, 15)))
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": noise}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "408"}, {"role": "assistant", "content": "ok"}]}))
    (tmp / "calls.jsonl").write_text("\n".join(lines) + "\n")
    prepare_chat([tmp / "calls.jsonl"], "char", "calls", tmp / "data", progress=False)
    out = tmp / "out"
    args = tiny_args(tmp / "data", out, dataset="calls", block_size=64, batch_size=8, dropout=0.0, n_embd=48,
                     learning_rate=1e-2, min_lr=3e-4, max_iters=80, lr_decay_iters=80, eval_interval=80, eval_iters=0,
                     log_interval=80)
    assert train.main(args) == 0
    return out


@pytest.fixture(scope="module")
def trained(run):
    model, tokenizer, _ = load_model(out_dir=str(run))
    return model.eval(), tokenizer


def test_a_reply_calls_the_calculator_and_goes_on_after_its_output(trained):
    model, tokenizer = trained
    session = chat_session.Session(model, tokenizer)
    info = {}
    shown = []
    answer = chat_session.reply(session, "qwerty zx", dataclasses.replace(BASE, max_new_tokens=30), CPU,
                                on_text=shown.append, info=info)
    assert answer == CALLED and "".join(shown) == CALLED  # streamed through the call
    assert info["calls"] == [{"expression": "12*34", "output": "408"}] and info["stopped"]
    assert info["new_tokens"] == len(tokenizer.encode("12*34")) + 2 + len(tokenizer.encode("ok")) + 1  # the model's only
    user, call, output, going_on = session.history
    assert call["tool_calls"][0]["function"]["arguments"] == json.dumps({"expression": "12*34"})
    assert (output, going_on) == ({"role": "tool", "content": "408"}, {"role": "assistant", "content": "ok"})
    # the history's tokens are the ones generated: the next prompt holds the reply as it was written
    special = special_ids(tokenizer.vocab_size, tools=True)
    reply_ids = [special["<|call|>"], *tokenizer.encode("12*34"), special["<|/call|>"], special["<|output|>"],
                 *tokenizer.encode("408"), special["<|/output|>"], *tokenizer.encode("ok"), special["<|end|>"]]
    asked = prompt_ids([user], tokenizer.encode, tokenizer.vocab_size)
    assert prompt_ids(session.history, tokenizer.encode, tokenizer.vocab_size)[:-1] == asked + reply_ids
    assert marked_reply_messages(answer, tokenizer.vocab_size) == [call, output, going_on]  # the API's text, read back


def test_tools_none_leaves_the_model_to_write_on_alone(trained):
    model, tokenizer = trained
    session = chat_session.Session(model, tokenizer, tools="none")
    info = {}
    answer = chat_session.reply(session, "qwerty zx", dataclasses.replace(BASE, max_new_tokens=30), CPU, info=info)
    assert info["calls"] == [] and answer.startswith("<|call|>12*34<|/call|>") and "<|output|>408" not in answer
    assert info["new_tokens"] > len(tokenizer.encode("12*34")) + 2  # it wrote on after the call


def test_a_call_in_one_row_never_changes_another_rows_reply(trained):
    """Tool rows (greedy and sampled) among plain continuations and chat rows whose sampled
    replies may not call: each reply, batched, equals its reply alone."""
    model, tokenizer = trained
    worker = Worker(model, tokenizer, CPU, capacity=32, max_batch=16)
    r = random.Random(1)
    jobs = []
    for i in range(10):
        noise = "".join(r.choice(LETTERS) for _ in range(r.randint(3, 20)))
        settings = dataclasses.replace(BASE, max_new_tokens=[30, 12, 40][i % 3], seed=50 + i,
                                       temperature=[0.0, 1.0, 2.0][i % 3], top_k=[None, 4][i % 2])
        if i % 4 == 3:
            jobs.append(Job(settings, None, prompt=tokenizer.encode(noise)))
        else:
            jobs.append(Job(settings, None, messages=[{"role": "user", "content": noise}]))
    gathered = [collect(job) for job in jobs]
    worker.start()
    try:
        for job in jobs:
            worker.submit(job)
        for _, ended in gathered:
            assert ended.wait(60)
    finally:
        worker.stop()
        worker.join(10)
    called = 0
    for job, (events, _) in zip(jobs, gathered):
        assert events[-1][0] == "done", events[-1]
        reply = texts(events)[0]
        assert reply == alone(model, tokenizer, job, worker), job
        tools = [value for kind, value in events if kind == "tool"]
        assert len(tools) == reply.count("<|/call|>")
        called += len(tools)
        if job.messages is not None and job.settings.temperature == 0:
            assert reply == CALLED and tools == [{"index": 0, "expression": "12*34", "output": "408"}]
    assert called >= 4


def test_serve_tools_none_forces_nothing(trained):
    model, tokenizer = trained
    worker = Worker(model, tokenizer, CPU, capacity=4, max_batch=4, tools="none")
    job = Job(dataclasses.replace(BASE, max_new_tokens=30), None, messages=[{"role": "user", "content": "qwerty zx"}])
    events, ended = collect(job)
    worker.start()
    try:
        worker.submit(job)
        assert ended.wait(60)
    finally:
        worker.stop()
        worker.join(10)
    session = chat_session.Session(model, tokenizer, tools="none")
    expected = chat_session.reply(session, "qwerty zx", job.settings, CPU)
    assert texts(events)[0] == expected and not [e for e in events if e[0] == "tool"]


@pytest.fixture(scope="module")
def server(run):
    s = Server(f"--out_dir={run}")
    yield s
    s.stop()


def test_the_api_returns_the_text_and_the_calls_streamed_or_not(server, trained):
    model, tokenizer = trained
    body = {"messages": [{"role": "user", "content": "qwerty zx"}], "temperature": 0, "max_tokens": 30}
    status, reply = post(server.url + "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == CALLED
    assert reply["gptkit"]["tool_calls"] == [[{"expression": "12*34", "output": "408"}]]
    events = []
    for line in post_stream(server.url + "/v1/chat/completions", {**body, "stream": True}):
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    at = next(i for i, e in enumerate(events) if "tool_call" in e.get("gptkit", {}))
    assert events[at]["gptkit"]["tool_call"] == {"expression": "12*34", "output": "408"}
    assert "".join(pieces) == CALLED and "".join(pieces[:at]) == "<|call|>12*34"  # the call ran, then its output
    assert "".join(pieces[at:]).startswith("<|/call|><|output|>408<|/output|>")
    # the reply sent back as history is read as the tokens it was: the next turn's prompt holds them
    session = chat_session.Session(model, tokenizer)
    chat_session.reply(session, "qwerty zx", dataclasses.replace(BASE, max_new_tokens=30), CPU)
    second = {**body, "messages": body["messages"] + [{"role": "assistant", "content": CALLED},
                                                      {"role": "user", "content": "asdf"}]}
    status, again = post(server.url + "/v1/chat/completions", second)
    assert status == 200, again
    expected = chat_session.reply(session, "asdf", dataclasses.replace(BASE, max_new_tokens=30), CPU)
    assert again["choices"][0]["message"]["content"] == expected
    assert len(session.history) == 8 and again["gptkit"]["dropped_messages"] == 0  # the first reply's tokens are in
    # a third turn leaves no room for the first exchange: the two messages the client sent for it are dropped
    third = {**body, "messages": second["messages"] + [{"role": "assistant", "content": expected},
                                                       {"role": "user", "content": "qwerty zx"}]}
    status, later = post(server.url + "/v1/chat/completions", third)
    assert status == 200 and later["gptkit"]["dropped_messages"] == 2, later
    assert later["choices"][0]["message"]["content"] == chat_session.reply(
        session, "qwerty zx", dataclasses.replace(BASE, max_new_tokens=30), CPU)
    assert again["usage"]["prompt_tokens"] == len(prompt_ids(session.history[:-3], tokenizer.encode, tokenizer.vocab_size))


def test_the_page_shows_the_call_and_its_output_apart_from_the_text(server):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-test.txt)")
    from test_serve_browser import BROWSERS, DRIVERS, find

    binary, driver = find(BROWSERS), find(DRIVERS)
    if binary is None or driver is None:
        pytest.skip("no Chromium and chromedriver on PATH")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    try:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 30, poll_frequency=0.05)
        wait.until(lambda b: server.name in b.find_element(By.ID, "status").text)
        browser.execute_script("document.querySelector('details').open = true")
        browser.find_element(By.ID, "temperature").clear()
        browser.find_element(By.ID, "temperature").send_keys("0")
        browser.find_element(By.ID, "input").send_keys("qwerty zx", Keys.ENTER)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-done]"))
        reply = browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1]
        assert [e.text for e in reply.find_elements(By.CSS_SELECTOR, ".call")] == ["calculator: 12*34"]
        assert [e.text for e in reply.find_elements(By.CSS_SELECTOR, ".output")] == ["= 408"]
        assert reply.text.endswith("ok") and "<|" not in reply.text
    finally:
        browser.quit()


def test_eval_gsm8k_on_a_model_with_tool_tokens_runs_its_calls(run, tmp_path, capsys):
    """eval.py --tasks gsm8k asks a chat model with the tool tokens through sample.py --chat's
    loop: the calculator's 408 is in the reply, and its last number is the answer."""
    import eval as eval_script

    rows = [{"question": "qwerty zx", "answer": "12*34 = <<12*34=408>>408\n#### 408"},
            {"question": "asdf", "answer": "#### 7"}]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert eval_script.main([str(run), "--tasks", "gsm8k", "--task_file", f"gsm8k={path}", "--json=-",
                             "--no_progress"]) == 0
    (line,) = json.loads(capsys.readouterr().out)["models"][0]["tasks"]["tasks"]
    assert line["form"] == "chat" and line["items"] == 2 and line["acc"] == 0.5  # 408 right, 7 not


def test_rl_rollouts_run_the_tool_and_learn_only_the_models_tokens(run, trained, tmp_path):
    """rl.py on a model with tool tokens: its rollouts run the calculator (serve.py's batch
    rows), the forced output is masked out of the loss, and the reward reads the final text."""
    import rl

    model, tokenizer = trained
    chat = rl.Chat(tokenizer, {}, run, model.config.block_size, model.config.vocab_size)
    ids = chat.prompt([{"role": "user", "content": "qwerty zx"}])
    g = torch.Generator().manual_seed(0)
    replies, masks = rl.tool_replies(model, chat, [ids, ids], 0.0, None, 30, g)
    special = special_ids(tokenizer.vocab_size, tools=True)
    forced = [special["<|output|>"], *tokenizer.encode("408"), special["<|/output|>"]]
    for reply, mask in zip(replies, masks):
        at = reply.index(special["<|/call|>"]) + 1
        assert reply[at : at + len(forced)] == forced and len(mask) == len(reply)
        assert mask == [1] * at + [0] * len(forced) + [1] * (len(reply) - at - len(forced))
        assert chat.final_text(reply) == "ok" and chat.text(reply) == CALLED
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "qwerty zx", "answer": "ok"}) + "\n")
    out = tmp_path / "rl"
    assert rl.main([str(REPO / "configs" / "rl_arithmetic.py"), f"--init_from={run}", f"--out_dir={out}",
                    f"--task={prompts}", f"--eval_task={prompts}", "--max_new_tokens=30", "--max_iters=1",
                    "--eval_interval=1", "--prompts_per_step=1", "--group_size=2", "--batch_size=2"]) == 0
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["pass1"] for e in evals if e["kind"] == "rl_eval"][0] == 1.0
