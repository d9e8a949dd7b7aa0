"""A learner's edit to model.py always takes effect, in every command: training's fused
kernels (gptkit/fast/fused.py's RMSNorm and ReLU²) check themselves against model.py on the
run's own model and fall back with one line where they differ; sampling, chat and
serving run model.py's own forward with faster products swapped in for its nn.Linear
modules (gptkit/fast/cpu_linears.py), so any edit runs as written.

Each case copies the tree, edits model.py as a learner would (a changed value in the MLP,
an activation clamped, attention written by hand with its scores scaled, RMSNorm, every
submodule and class renamed with all their uses, a submodule added to each block), and in
one process trains a few steps with the default kernels and with --cpu_kernels model,
samples with the default decode and with --cpu_decode false, and chats both ways; then
serve.py answers with the same model. The defaults must equal model.py's own path, differ
from the unedited tree's, and no command may print a traceback."""

import json
import re
import shutil
import subprocess
import sys
import threading

import pytest

from repo import REPO
from serve_helpers import Server, post, write_checkpoint

ADDED = [("        self.mlp = MLP(config)\n",
          "        self.mlp = MLP(config)\n        self.gate = nn.Linear(config.n_embd, config.n_embd)\n"),
         ("            return x + self.mlp(self.ln_2(x))\n",
          "            x = x + self.mlp(self.ln_2(x))\n            return x + 0.5 * torch.tanh(self.gate(x))\n")]
# Every use of a name renamed at once, as a learner's editor does it: every submodule
# (the attention's and the MLP's matrices, the attention, the norms, the output layer, the
# blocks' list, the token embedding) and every module class, RMSNorm among them (which
# gptkit/fast/fused.py swaps).
RENAMED_EVERYWHERE = {r"\bc_fc\b": "c_up", r"\blm_head\b": "head",
                      r"\bh=nn\.ModuleList": "blocks=nn.ModuleList", r"\btransformer\.h\b": "transformer.blocks",
                      r"\bwte\b": "tok_emb", r"\bRMSNorm\b": "RootMeanSquareNorm",
                      r"\bc_attn\b": "qkv_proj", r"\bc_proj\b": "out_proj", r"\battn\b": "self_attn",
                      r"\bln_1\b": "norm1", r"\bln_2\b": "norm2", r"\bln_f\b": "final_norm",
                      r"\bCausalSelfAttention\b": "SelfAttention", r"\bMLP\b": "FeedForward",
                      r"\bBlock\b": "TransformerBlock", r"\bReLU2\b": "SquaredReLU"}
# LoRA's targets are names (attn.c_attn, ...: --lora_targets, docs/lora.md): a model whose
# attention is renamed refuses them in one line, so the LoRA test below keeps those names.
LORA_NAMES = (r"\bc_attn\b", r"\bc_proj\b", r"\battn\b")
EDITS = {  # name: [(old, new), ...], each old found once in model.py
    "mlp": [("        return self.dropout(self.c_proj(h))\n",
             "        return self.dropout(self.c_proj(h)) * 0.5\n")],
    "activation": [("        return F.relu(h).square()\n", "        return F.relu(h).clamp(max=0.001).square()\n")],
    "renamed": RENAMED_EVERYWHERE,
    "added": ADDED,
    # attention written out by hand, as in nanoGPT's slow path, its scores scaled 3x
    "attention": [("        else:\n            y = F.scaled_dot_product_attention(\n",
                   "        elif True:\n"
                   "            att = (q @ k.transpose(-2, -1)) * (3.0 / math.sqrt(k.size(-1)))\n"
                   "            if mask is not None:\n"
                   "                att = att.masked_fill(~mask, float('-inf'))\n"
                   "            elif T > 1:\n"
                   "                causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()\n"
                   "                att = att.masked_fill(~causal, float('-inf'))\n"
                   "            y = att.softmax(-1) @ v\n"
                   "        else:\n            y = F.scaled_dot_product_attention(\n")],
    "rmsnorm": [("        y = F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)\n",
                 "        y = 0.5 * F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)\n")],
}

# Edits to both fused modules' formulas that a probe of one small input in evaluation
# mode missed: ReLU² changed for large inputs only, RMSNorm in training mode only.
FUSED_EDITS = [
    ("        return F.relu(h).square()\n", "        return F.relu(h).clamp(max=3.5).square()\n"),
    ("        y = F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)\n",
     "        y = F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)\n        y = y * 1.5 if self.training else y\n"),
]

# Run inside a tree: train twice, sample twice, print what happened as one JSON line.
PROBE = r"""
import contextlib, io, json, sys
import sample, train
data, out, sampling = sys.argv[1], sys.argv[2], sys.argv[3] == "sample"
common = ["--dataset=tiny", f"--data_dir={data}", "--n_layer=2", "--n_head=2", "--n_embd=32",
          "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=4",
          "--eval_interval=4", "--eval_iters=1", "--log_interval=1", "--compile=false", "--device=cpu",
          "--dtype=float32", "--norm=rmsnorm", "--mlp=relu2", "--pos_encoding=learned",
          "--learning_rate=1e-2", "--warmup_iters=0", "--progress_bar=false"]
result = {}
for kernels in ("fused", "model"):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train.main(common + [f"--out_dir={out}-{kernels}", f"--cpu_kernels={kernels}"]) == 0
    rows = [json.loads(line) for line in open(f"{out}-{kernels}/metrics.jsonl")]
    result[kernels] = {"losses": [r["loss"] for r in rows if "loss" in r], "log": printed.getvalue()}
if not sampling:
    print(json.dumps(result))
    sys.exit(0)
for decode in ("true", "false"):
    text, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(said):
        assert sample.main([f"--out_dir={out}-fused", "--start=ab", "--num_samples=1",
                            "--max_new_tokens=24", "--seed=1", f"--cpu_decode={decode}"]) == 0
    result["decode_" + decode] = {"text": text.getvalue(), "stderr": said.getvalue()}
text, said = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(text), contextlib.redirect_stderr(said):
    assert sample.main([f"--out_dir={out}-fused", "--start=ab", "--num_samples=1", "--max_new_tokens=24",
                        "--seed=1", "--dtype=int8"]) == 0
result["decode_int8"] = {"text": text.getvalue(), "stderr": said.getvalue()}
# the logits sampling runs on, swapped parts and model.py's nn.Linear: the edit's effect in numbers
import torch
from gptkit.generation.generate import cached_logits, prepare_for_generating
from gptkit.models.loading import load_model
for decode, dtype in ((True, "float32"), (False, "float32"), ("int8", "int8")):
    net = load_model("resume", f"{out}-fused", None, "data", None)[0]
    prepare_for_generating(net, dtype, torch.device("cpu"), cpu_decode=True if decode == "int8" else decode,
                           note=print)
    result[f"logits_{decode}"] = cached_logits(net, torch.tensor([[1, 2, 3, 4]])).flatten().tolist()
# a chat model of the same architecture: the trained weights and 4 turn tokens
from gptkit.ops.checkpoint import load_checkpoint, save_checkpoint
from gptkit.models.loading import find_checkpoint
ckpt = load_checkpoint(find_checkpoint(f"{out}-fused"))
model = __import__("model").GPT(__import__("model").GPTConfig(**ckpt["model_config"]))
model.load_state_dict(ckpt["model"])
model.grow_vocab(model.config.vocab_size + 4)
import dataclasses
save_checkpoint(dict(ckpt, model=model.state_dict(), model_config=dataclasses.asdict(model.config)),
                f"{out}-chat.pt")
for decode in ("true", "false"):
    text, said = io.StringIO(), io.StringIO()
    sys.stdin = io.StringIO("ab\nba\n")
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(said):
        assert sample.main([f"--ckpt={out}-chat.pt", "--chat", "--max_new_tokens=12", "--temperature=0",
                            f"--cpu_decode={decode}"]) == 0
    result["chat_" + decode] = {"text": text.getvalue(), "stderr": said.getvalue()}
print(json.dumps(result))
"""


def beside_the_code(folder, names):
    """What a copy of the tree leaves out: git's files, caches, data and runs at the root."""
    at_root = folder == str(REPO)
    return [n for n in names if n in ("__pycache__", ".pytest_cache")
            or at_root and (n in (".git", "data") or n.startswith("out-"))]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-paths")
    text = root / "tiny.txt"
    text.write_text("".join(f"the {w} and the {w[::-1]} sat on a mat. " for w in
                            ("cat", "dog", "bird", "fish", "horse", "mouse") * 60))
    cmd = [sys.executable, "prepare.py", "--input", str(text), "--tokenizer", "char", "--name", "tiny",
           "--out_dir", str(root / "data")]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=120)
    return root


def probe(tree, root, name, sampling=True):
    result = subprocess.run([sys.executable, "-c", PROBE, str(root / "data"), str(root / f"out-{name}"),
                             "sample" if sampling else "train"],
                            cwd=tree, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    if sampling:
        got["serve"] = served(tree, root / f"out-{name}-chat.pt")
    return got


def served(tree, checkpoint):
    """serve.py in `tree` on `checkpoint`: its stderr and a greedy chat reply."""
    server = Server(f"--ckpt={checkpoint}", cwd=tree)
    try:
        status, reply = post(server.url + "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 12, "temperature": 0})
        assert status == 200, reply
    finally:
        _, said = server.stop()
    return {"reply": reply["choices"][0]["message"]["content"], "stderr": said}


@pytest.fixture(scope="module")
def unedited(tiny_data):
    return probe(REPO, tiny_data, "unedited")


def test_unedited_the_fast_paths_run_and_are_named(unedited):
    assert "kernels gptkit/fast/fused.py (RMSNorm, ReLU² backward by hand, checked against model.py" in unedited["fused"]["log"]
    assert "does not match" not in unedited["fused"]["log"]
    said = unedited["decode_true"]["stderr"]
    swapped = "decode: model.py's forward with its KV cache; 9 nn.Linear replaced by NumPyLinear (gptkit/fast/cpu_linears.py"
    assert swapped in said and "nn.Linear" not in said.replace(swapped, "").replace("keeps nn.Linear)", "")
    assert "decode: model.py's forward with its KV cache\n" in unedited["decode_false"]["stderr"]
    assert unedited["decode_true"]["text"] == unedited["decode_false"]["text"]
    assert unedited["chat_true"]["text"] == unedited["chat_false"]["text"]
    assert unedited["logits_True"] == pytest.approx(unedited["logits_False"], abs=1e-5)
    assert swapped in unedited["serve"]["stderr"] and "one at a time" not in unedited["serve"]["stderr"]
    assert "Traceback" not in json.dumps(unedited)
    assert unedited["fused"]["losses"] == pytest.approx(unedited["model"]["losses"], abs=1e-5)


def edited_tree(tmp_path, *edits):
    """A copy of the tree with model.py edited: (old, new) pairs, each old found once, or
    a dict {pattern: new} of renames, every match replaced."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=beside_the_code)
    source = (tree / "model.py").read_text()
    if len(edits) == 1 and isinstance(edits[0], dict):
        for pattern, new in edits[0].items():
            source, found = re.subn(pattern, new, source)
            assert found, pattern
    for old, new in () if isinstance(edits[0], dict) else edits:
        assert source.count(old) == 1
        source = source.replace(old, new)
    (tree / "model.py").write_text(source)
    return tree


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_to_model_py_is_what_trains_and_samples(edit, tiny_data, unedited, tmp_path):
    edits = EDITS[edit]
    tree = edited_tree(tmp_path, *([edits] if isinstance(edits, dict) else edits))
    if edit == "renamed":  # every use renamed: none left
        assert "c_fc" not in (tree / "model.py").read_text()
    got = probe(tree, tiny_data, edit)
    assert "Traceback" not in json.dumps(got)
    # training follows the edit, whichever kernels were asked for
    assert got["fused"]["losses"] == pytest.approx(got["model"]["losses"], abs=1e-5)
    same = edit == "renamed"  # a new name computes what the old one did; every other edit changes it
    assert (got["fused"]["losses"] == pytest.approx(unedited["fused"]["losses"], abs=1e-5)) == same
    if edit == "rmsnorm":  # the one fused module this edit touches: it fell back, and said so
        assert "kernels: gptkit/fast/fused.py's RMSNorm does not match model.py's" in got["fused"]["log"]
        assert "kernels gptkit/fast/fused.py (ReLU² backward by hand" in got["fused"]["log"]
    # sampling, chat and serving run the edited model.py, its Linears swapped (one more per block when added)
    linears = 9 + 2 * (edit == "added")
    for said in (got["decode_true"]["stderr"], got["serve"]["stderr"]):
        assert f"decode: model.py's forward with its KV cache; {linears} nn.Linear replaced by NumPyLinear" in said
    assert got["decode_true"]["text"] == got["decode_false"]["text"]
    assert got["logits_True"] == pytest.approx(got["logits_False"], abs=1e-5)
    # --dtype int8 runs the edited model too: its logits near this tree's float32 ones, not the unedited tree's
    assert f"{linears} nn.Linear replaced by Int8Linear" in got["decode_int8"]["stderr"] and got["decode_int8"]["text"]
    int8_gap = max(abs(a - b) for a, b in zip(got["logits_int8"], got["logits_False"]))
    assert int8_gap <= 0.05 * max(map(abs, got["logits_False"])), int8_gap
    if not same:
        assert int8_gap < max(abs(a - b) for a, b in zip(got["logits_int8"], unedited["logits_False"]))
    assert (got["logits_True"] == pytest.approx(unedited["logits_True"], abs=1e-4)) == same
    assert got["chat_true"]["text"] == got["chat_false"]["text"]
    assert got["serve"]["reply"] in got["chat_true"]["text"]


def test_edits_to_the_fused_formulas_for_some_inputs_or_in_training_only_fall_back_named(tiny_data, unedited,
                                                                                          tmp_path):
    """The self-check probes training and evaluation mode at scales from 1e-4 to 1e4: each
    fused module an edit touches falls back with one line naming it, and the default run
    trains what --cpu_kernels model trains (the other, unedited kinds stay fused: the
    rmsnorm case above)."""
    got = probe(edited_tree(tmp_path, *FUSED_EDITS), tiny_data, "fused-edits", sampling=False)
    log = got["fused"]["log"]
    fallback = [line for line in log.splitlines() if "does not match" in line]
    assert len(fallback) == 2, log
    for line, kind, why in zip(fallback, ("RMSNorm", "ReLU2"), ("in training mode", "of scale 10")):
        assert line.startswith(f"kernels: gptkit/fast/fused.py's {kind} does not match model.py's ("), line
        assert why in line and line.endswith(f"): model.py's {kind} runs"), line
    assert "kernels model.py" in log
    assert got["fused"]["losses"] == pytest.approx(got["model"]["losses"], abs=1e-5)
    # RMSNorm scaled in training: the run trains the edit (the tiny run's h stays below 3.5)
    assert got["fused"]["losses"] != pytest.approx(unedited["fused"]["losses"], abs=1e-5)


def test_renamed_modules_train_with_muon_resume_fine_tune_and_refuse_to_convert(tiny_data, tmp_path):
    """What finds the model's parts by what they are, not by model.py's names: Muon's
    matrices (the blocks' list), LoRA's blocks and its trained vocabulary matrices, the
    MFU's count, the checkpoint's shape check. The exports map names one by one: they
    refuse, in one line, a model whose names they cannot place, and write nothing."""
    tree = edited_tree(tmp_path, {k: v for k, v in RENAMED_EVERYWHERE.items() if k not in LORA_NAMES})
    out = tmp_path / "out"
    common = [f"--data_dir={tiny_data / 'data'}", "--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32",
              "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1",
              "--compile=false", "--device=cpu", "--progress_bar=false",
              "--norm=rmsnorm", "--mlp=swiglu", "--pos_encoding=rope", "--bias=false"]  # LLaMA-shaped: it exports

    def run(*args):
        done = subprocess.run([sys.executable, *args], cwd=tree, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
        return done

    for steps in (4, 6):  # 6: resumed from the 4th step's checkpoint
        done = run("train.py", *common, f"--out_dir={out}", f"--max_iters={steps}", "--eval_interval=2",
                   "--optimizer=muon", *(["--init_from=resume"] if steps == 6 else []))
        assert done.returncode == 0 and f"done: {steps} iterations" in done.stdout, done.stdout[-2000:]
    done = run("train.py", *common, f"--out_dir={out}-lora", f"--init_from={out}", "--lora_rank=2",
               "--max_iters=2", "--eval_interval=2")
    assert done.returncode == 0, done.stdout[-2000:]
    done = run("sample.py", f"--out_dir={out}-lora", "--start=the", "--max_new_tokens=8", "--num_samples=1")
    assert done.returncode == 0 and "LoRA rank 2" in done.stderr and done.stdout.strip(), done.stderr
    for to, dest in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "model.gguf")):
        done = run("convert.py", str(out), str(dest), "--to", to)
        assert done.returncode == 2 and not dest.exists(), done.stderr
        assert done.stderr.count("\n") == 1 and "transformer.tok_emb.weight" in done.stderr
        assert "nothing was written" in done.stderr


# Edits that hold for one row and not for several: serve.py's batch of replies of
# different lengths would attend to another row's padding, or fail on a tensor position.
BATCH_BREAKING = {
    "attention without the mask": [("attn_mask=mask, dropout_p=dropout_p, is_causal=(T > 1 and mask is None),",
                                    "attn_mask=None, dropout_p=dropout_p, is_causal=T > 1,")],
    "a position read as one number": [("        x = self.transformer.wte(idx)  # (B, T, C)\n",
                                       "        x = self.transformer.wte(idx)  # (B, T, C)\n"
                                       "        x = x + 0.01 * int(start)\n")],
}


@pytest.mark.parametrize("edit", sorted(BATCH_BREAKING))
def test_an_edit_that_cannot_batch_serves_one_reply_at_a_time_and_says_so(edit, tmp_path):
    """serve.py checks at start that rows of different lengths run together as each runs
    alone (gptkit/serve/batch.py's batching_differs); where they do not, replies run one at
    a time, one line says why, and concurrent replies equal those of requests sent alone."""
    tree = edited_tree(tmp_path, *BATCH_BREAKING[edit])
    server = Server(f"--ckpt={write_checkpoint(tmp_path / 'plain.pt', chat=False)}", cwd=tree)
    prompts = ["ab", "the cat sat on the mat and", "x", "a dog and a bird sat"]
    replies = {}

    def ask(prompt, key):
        status, reply = post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})
        replies[key] = reply["choices"][0]["text"] if status == 200 else reply

    try:
        for prompt in prompts:
            ask(prompt, ("alone", prompt))
        threads = [threading.Thread(target=ask, args=(prompt, ("together", prompt))) for prompt in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        _, said = server.stop()
    assert "decode: replies run one at a time (--max_batch 1): model.py's forward does not batch" in said, said
    assert "Traceback" not in said
    assert [replies[("together", p)] for p in prompts] == [replies[("alone", p)] for p in prompts]


def test_an_attention_that_ignores_its_cache_samples_by_recomputing_and_serve_says_it_cannot(tmp_path):
    """A learner's attention that stores keys and values in the cache but attends to the new
    ones only: sample.py says so in one line and recomputes each token's context (its text
    is --use_cache false's); serve.py, whose batch needs the cache, stops in one line."""
    tree = edited_tree(tmp_path, ("            k, v = cache.update(layer, k, v)  # (B, Hkv, keys, D)\n",
                                  "            cache.update(layer, k, v)  # stored, never read\n"))
    checkpoint = write_checkpoint(tmp_path / "plain.pt", chat=False)
    texts = []
    for extra in ([], ["--use_cache=false"]):
        done = subprocess.run([sys.executable, "sample.py", f"--ckpt={checkpoint}", "--start=ab", "--seed=1",
                               "--max_new_tokens=30", "--num_samples=1", *extra],
                              cwd=tree, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        texts.append(done.stdout)
        said = [line for line in done.stderr.splitlines() if "through its KV cache is not its forward" in line]
        assert len(said) == (0 if extra else 1) and (extra or "each token recomputes its context" in said[0])
    assert texts[0] == texts[1]
    done = subprocess.run([sys.executable, "serve.py", f"--ckpt={checkpoint}", "--port=0"], cwd=tree,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: serve.py cannot run this model.py: its replies run "
                                                           "through the KV cache")
