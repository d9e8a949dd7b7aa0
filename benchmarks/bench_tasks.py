"""eval.py --tasks' multiple-choice scoring against lm-evaluation-harness: items per CPU second.

    python bench.py tasks                          # 200 ARC-style items, a small GPT-2-vocabulary model
    python bench.py tasks --items 50 --batch_size 16

One random model with GPT-2's vocabulary (--n_layer, --n_embd, --block_size), saved as
our checkpoint and exported with convert.py --to hf; the same items, in ARC's Hub
format (allenai/ai2_arc parquet), made of random words with 3 to 5 answers each.
Ours: gptkit/report_card.score_task (batched rows sorted by length, the output layer
on continuation positions only). lm-eval: simple_evaluate on its "hf" model (the
export, float32, the same batch size) with a local task yaml as its arc_easy, offline.
Both in this process at one thread (the bench re-runs itself with OMP_NUM_THREADS=1),
CPU seconds (process_time) of the scoring alone, model loading and imports excluded,
best of --repeats. Both choose the same answers (checked here on every run).
Needs lm-eval, pyarrow and GPT-2's BPE files (TIKTOKEN_CACHE_DIR offline).
"""

import os
import random
import tempfile
import time
from pathlib import Path

import torch

from gptkit.ops.errors import UserError

WORDS = ("stone river light water plant animal metal heat cloud seed wind energy sound ground forest rain "
         "moon sun earth glass paper iron salt sugar ice fire shadow mirror bridge engine wheel").split()


def add_arguments(parser):
    parser.add_argument("--items", type=int, default=200, help="ARC-style items scored (default 200)")
    parser.add_argument("--batch_size", type=int, default=32, help="sequences per forward pass, both (default 32)")
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each, best kept (default 2)")
    parser.add_argument("--seed", type=int, default=1337)


def arc_rows(n, seed):
    rng = random.Random(seed)

    def words(k):
        return " ".join(rng.choice(WORDS) for _ in range(k))

    rows = []
    for i in range(n):
        k = rng.choice((3, 4, 4, 4, 5))
        labels = list("ABCDE"[:k])
        rows.append({"id": f"bench_{i}", "question": words(rng.randint(8, 30)) + "?",
                     "choices": {"text": [words(rng.randint(1, 6)) for _ in range(k)], "label": labels},
                     "answerKey": rng.choice(labels)})
    return rows


YAML = """task: bench_arc
dataset_path: parquet
dataset_kwargs: {{data_files: {{test: "{path}"}}}}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
"""


def write_random_run(folder, args, tokenizer_dict):
    """folder/ckpt.pt: a random GPT of our own format (embeddings scaled so that answers differ clearly)."""
    import dataclasses

    from gptkit.ops.checkpoint import FORMAT_VERSION, save_checkpoint
    from model import GPT, GPTConfig

    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(block_size=args.block_size, vocab_size=50257, n_layer=args.n_layer,
                          n_head=max(1, args.n_embd // 64), n_embd=args.n_embd, dropout=0.0))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(10)
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(model.config), "tokenizer": tokenizer_dict},
                    folder / "ckpt.pt")
    return folder


def run(args):
    from benchmarks.one_thread import in_one_thread
    from benchmarks.report import Table

    if args.items < 1 or args.batch_size < 1 or args.repeats < 1:
        raise UserError("--items, --batch_size and --repeats must be at least 1")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise UserError(f"bench.py tasks compares with lm-evaluation-harness: pip install lm-eval pyarrow ({e})")
    in_one_thread("tasks")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    import convert
    from gptkit.evals import report_card
    from gptkit.evals import tasks
    from gptkit.evals.evaluation import Settings, load_candidate
    from gptkit.data.tokenizer import GPT2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = write_random_run(tmp / "run", args, GPT2Tokenizer().to_dict())
        convert.main([str(run_dir), str(tmp / "hf"), "--to", "hf"])
        path = tmp / "test-00000-of-00001.parquet"
        pq.write_table(pa.Table.from_pylist(arc_rows(args.items, args.seed)), path)
        (tmp / "yaml").mkdir()
        (tmp / "yaml" / "bench_arc.yaml").write_text(YAML.format(path=path))

        candidate = load_candidate(str(run_dir))
        task = tasks.TASKS["arc_easy"]
        items = tasks.read_task(task, path)
        settings = Settings(torch.device("cpu"), torch.float32, progress=False)
        lm = HFLM(pretrained=str(tmp / "hf"), dtype="float32", batch_size=args.batch_size, device="cpu")
        manager = TaskManager(include_path=str(tmp / "yaml"))

        def ours():
            return report_card.score_task(candidate, task, items, settings, batch_rows=args.batch_size)

        def theirs():
            return simple_evaluate(model=lm, tasks=["bench_arc"], task_manager=manager, log_samples=True,
                                   verbosity="ERROR")

        best = {"ours": float("inf"), "lm-eval": float("inf")}
        outputs = {}
        for _ in range(args.repeats):
            for name, call in (("ours", ours), ("lm-eval", theirs)):
                t0 = time.process_time()
                outputs[name] = call()
                best[name] = min(best[name], time.process_time() - t0)

    line = outputs["ours"]
    samples = sorted(outputs["lm-eval"]["samples"]["bench_arc"], key=lambda s: s["doc_id"])
    agree = sum(float(p[0] == it.gold) == s["acc"] and float(p[1] == it.gold) == s["acc_norm"]
                for p, it, s in zip(line["predictions"], items, samples))
    rows = sum(len(it.pairs) for it in items)
    c = candidate.model.config
    table = Table(f"Multiple-choice scoring, {args.items} ARC-style items ({rows} answers), "
                  f"{c.n_layer} layers x {c.n_embd}, GPT-2 vocabulary, float32, one thread, CPU",
                  ["scorer", "CPU s", "items per CPU s", "vs lm-eval", "same acc and acc_norm"],
                  note=f"Best of {args.repeats} runs each, batch {args.batch_size} sequences, imports and model "
                  "loading excluded; lm-eval 'hf' model on our convert.py --to hf export, local task yaml.")
    for name in ("ours", "lm-eval"):
        table.add_row("eval.py --tasks" if name == "ours" else "lm-evaluation-harness", round(best[name], 3),
                      round(args.items / best[name], 1), f"{best['lm-eval'] / best[name]:.2f}x",
                      f"{agree}/{len(items)} items")
    return [table]
