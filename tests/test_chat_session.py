"""sample.py --chat and eval.py on a chat model: trained on noise with one constant reply, it
answers a new noisy message with exactly that reply; eval.py's target-only loss is train.py's."""

import json
import random
import subprocess
import sys

import pytest
import torch
from repo import REPO
from train_helpers import read_metrics, tiny_args

import train
from gptkit.data.chat import prompt_ids, turn_ids
from gptkit.generation.chat_session import Session
from gptkit.ops.errors import UserError
from gptkit.prepare.chat import prepare_chat
from gptkit.data.tokenizer import CharTokenizer
from model import GPT, GPTConfig

REPLY = "I hear you."
LETTERS = "abcdefghijklmnopqrstuvwxyz "


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data_dir, out_dir) of a model trained on noisy user turns and one constant reply."""
    tmp = tmp_path_factory.mktemp("chat")
    r = random.Random(0)
    lines = []
    for _ in range(200):
        noise = "".join(r.choice(LETTERS) for _ in range(r.randint(5, 20)))
        lines.append(json.dumps({"messages": [{"role": "user", "content": noise}, {"role": "assistant", "content": REPLY}]}))
    (tmp / "noise.jsonl").write_text("\n".join(lines) + "\n")
    prepare_chat([tmp / "noise.jsonl"], "char", "noise", tmp / "data", progress=False)
    out = tmp / "out"
    args = tiny_args(tmp / "data", out, dataset="noise", block_size=48, batch_size=8, dropout=0.0, n_embd=48,
                     learning_rate=1e-2, min_lr=3e-4, max_iters=60, lr_decay_iters=60, eval_interval=60, eval_iters=0)
    assert train.main(args) == 0
    return tmp / "data", out


def run(script, *args, stdin=""):
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_chat_answers_a_new_noisy_message_with_exactly_the_reply(trained):
    _, out = trained
    r = run("sample.py", f"--out_dir={out}", "--chat", "--temperature=0", stdin="qzx wvut plmokn\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == REPLY + "\n"
    r = run("sample.py", f"--out_dir={out}", "--chat", "--seed=5", "--top_k=5", stdin="\nhjkl asdf\n")
    assert r.returncode == 0 and r.stdout == REPLY + "\n"  # sampled, as confident; the empty line is skipped
    r = run("sample.py", f"--out_dir={out}", "--chat", "--temperature=0", "--dtype=float16", stdin="mnbv cxz\n")
    assert r.returncode == 0 and r.stdout == REPLY + "\n", r.stderr  # float16 weights on a CPU answer the same


def test_chat_mistakes_are_one_line_and_exit_2(trained, tmp_path):
    _, out = trained
    r = run("sample.py", f"--out_dir={out}", "--chat", stdin="NOT IN THE VOCABULARY\n")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: the text has"), r.stderr
    r = run("sample.py", f"--out_dir={out}", "--chat", "--start=hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "leave out start" in r.stderr


def test_eval_reports_the_target_only_loss_train_reported(trained):
    data, out = trained
    r = run("eval.py", str(out / "ckpt.pt"), f"--data_dir={data}", "--dataset=noise", "--json=-", "--no_progress")
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)["models"]
    assert result["loss"] == pytest.approx(read_metrics(out, "eval")[-1]["val_loss"], abs=1e-5)
    assert result["bytes"] == 20 * (len(REPLY))  # 20 val replies' text; <|end|> decodes to no bytes
    assert result["bpb"] == pytest.approx(result["loss"] * result["tokens"] / (result["bytes"] * 0.6931471805599453))


def test_history_drops_the_oldest_turns_to_leave_room_for_a_reply():
    tok = CharTokenizer(sorted(set(LETTERS)))
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=46, vocab_size=tok.vocab_size + 4))
    s = Session(model, tok, system="ab")
    s.history = [{"role": "user", "content": "c" * 8}, {"role": "assistant", "content": "d" * 8},
                 {"role": "user", "content": "e" * 8}, {"role": "assistant", "content": "f" * 8},
                 {"role": "user", "content": "g" * 8}]
    ids = s.prompt(room=10)  # system 4 + 5 turns x 10 + <|assistant|> = 55: too long; without the first exchange 35
    assert [m["content"][0] for m in s.history] == ["e", "f", "g"]
    assert ids == prompt_ids(s.messages(), tok.encode, tok.vocab_size) and ids[:4] == [turn_ids(tok.vocab_size)["<|system|>"], *tok.encode("ab"), turn_ids(tok.vocab_size)["<|end|>"]]
    assert len(ids) == 35
    with pytest.raises(UserError, match="not chat-trained"):
        Session(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=tok.vocab_size)), tok)


def test_the_exported_model_answers_the_same_in_transformers_and_llama_cpp(trained, tmp_path):
    import convert

    _, out = trained
    assert convert.main([str(out), str(tmp_path / "hf"), "--to", "hf"]) == 0
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    messages = [{"role": "user", "content": "zzq plo wer"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
    end = tok.convert_tokens_to_ids("<|end|>")
    new = hf.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=end)[0, ids.shape[1]:]  # stops at <|end|>
    assert tok.decode(new, skip_special_tokens=True) == REPLY and new[-1] == end
    llama_cpp = pytest.importorskip("llama_cpp")
    assert convert.main([str(out), str(tmp_path / "chat.gguf"), "--to", "gguf", "--outtype", "f32"]) == 0
    llm = llama_cpp.Llama(model_path=str(tmp_path / "chat.gguf"), n_ctx=64, verbose=False)
    answer = llm.create_chat_completion(messages=messages, temperature=0, max_tokens=20)["choices"][0]["message"]
    assert answer == {"role": "assistant", "content": REPLY}


def test_exact_match_counts_the_replies_written_exactly(trained, tmp_path):
    data, out = trained
    r = run("eval.py", str(out), f"--data_dir={data}", "--dataset=noise", "--exact_match", "--json=-", "--no_progress")
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)["models"]
    assert result["exact_match"]["single"] == {"exact": 20, "replies": 20, "rate": 1.0}
    multi = result["exact_match"]["multi"]  # 20 conversations in sessions of 8: 17 later turns
    assert multi["replies"] == 20 - 3 and multi["rate"] >= 0.9
    untrained = tmp_path / "untrained"  # the same shape at initialisation writes no reply exactly
    from gptkit.ops.checkpoint import load_checkpoint
    from train_helpers import write_run

    ckpt = load_checkpoint(out / "ckpt.pt")
    torch.manual_seed(0)
    write_run(untrained, GPT(GPTConfig(**ckpt["model_config"])), ckpt["tokenizer"])
    r = run("eval.py", str(untrained), f"--data_dir={data}", "--dataset=noise", "--exact_match", "--no_progress")
    assert r.returncode == 0 and "exact match, untrained: single turn 0 of 20 (0.0%) replies" in r.stdout
    assert "multi-turn 0 of 17 (0.0%) later turns (up to 16" in r.stdout


def test_in_a_terminal_it_prompts_streams_the_reply_and_ctrl_d_leaves(trained):
    import os
    import pty
    import select
    import time

    _, out = trained
    pid, fd = pty.fork()
    if pid == 0:  # the child: sample.py on the terminal's other end
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, "sample.py", f"--out_dir={out}", "--chat", "--temperature=0"])
    seen = b""

    def read_until(text, timeout=60):
        nonlocal seen
        deadline = time.time() + timeout
        while text not in seen and time.time() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    seen += os.read(fd, 1000)
                except OSError:
                    return

    read_until(b"> ")
    os.write(fd, b"qwer asdf\n")
    read_until(REPLY.encode() + b"\r\n> ")
    os.write(fd, b"\x04")  # Ctrl-D
    _, status = os.waitpid(pid, 0)
    text = seen.decode().replace("\r\n", "\n")
    assert "Ctrl-D leaves\n> qwer asdf\nI hear you.\n> " in text and os.WEXITSTATUS(status) == 0


def test_sampling_a_chat_model_without_chat_writes_its_turn_markers(trained):
    # It was a traceback (IndexError) as soon as the model wrote a turn token.
    _, out = trained
    r = run("sample.py", f"--out_dir={out}", "--start=qwer asdf", "--max_new_tokens=60", "--num_samples=1",
            "--temperature=0")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "<|end|>" in r.stdout, r.stdout
