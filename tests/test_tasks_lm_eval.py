"""eval.py --tasks against an independent implementation: lm-evaluation-harness (`lm-eval`,
a test-only dependency) scores the same items, in the same publisher files, through our
Hugging Face export of the same tiny model (convert.py --to hf), offline, from task
definitions (yaml) that point at the local files. Item by item, the continuations' log
likelihoods, acc and acc_norm must agree with ours."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import convert
from gptkit.evals import report_card
from gptkit.evals import task_scoring
from gptkit.evals import tasks
from gptkit.evals.evaluation import Settings, load_candidate
from gptkit.data.tokenizer import GPT2Tokenizer
from model import GPTConfig
from task_files import ARC, LAMBADA, MMLU, write_task
from train_helpers import perturbed_model, subprocess_env, write_run

pytest.importorskip("lm_eval")
pytest.importorskip("pyarrow")

BLOCK = 32  # short enough that the longer items are cut from the left, as lm-eval cuts them

# The task definitions as lm-eval's own arc_easy, piqa, winogrande, mmlu_anatomy and
# lambada_openai yaml write them, reading local files instead of the Hub; HellaSwag with
# our context (its "ctx" field: lm-eval's own also prefixes the activity label).
YAML = {
    "local_arc": """
        dataset_path: parquet
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: multiple_choice
        test_split: test
        doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
        doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
        doc_to_choice: "{{{{choices.text}}}}"
        metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
    """,
    "local_piqa": """
        dataset_path: parquet
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: multiple_choice
        test_split: test
        doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
        doc_to_target: label
        doc_to_choice: "{{{{[sol1, sol2]}}}}"
        metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
    """,
    "local_winogrande": """
        dataset_path: parquet
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: multiple_choice
        test_split: test
        doc_to_text: !function wino.doc_to_text
        doc_to_target: !function wino.doc_to_target
        doc_to_choice: !function wino.doc_to_choice
        metric_list: [{{metric: acc}}]
    """,
    "local_mmlu": """
        dataset_path: parquet
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: multiple_choice
        test_split: test
        description: "The following are multiple choice questions (with answers) about anatomy.\\n\\n"
        doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\nC. {{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
        doc_to_choice: ["A", "B", "C", "D"]
        doc_to_target: answer
        metric_list: [{{metric: acc}}]
    """,
    "local_hellaswag": """
        dataset_path: json
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: multiple_choice
        test_split: test
        doc_to_text: "{{{{ctx}}}}"
        doc_to_target: label
        doc_to_choice: "{{{{endings}}}}"
        metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
    """,
    "local_lambada": """
        dataset_path: json
        dataset_kwargs: {{data_files: {{test: "{path}"}}}}
        output_type: loglikelihood
        test_split: test
        doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
        doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
        metric_list: [{{metric: acc}}]
    """,
}
WINO_FUNCTIONS = '''
def doc_to_text(doc):
    return {"1": 0, "2": 1}[doc["answer"]]

def doc_to_target(doc):
    return doc["sentence"][doc["sentence"].index("_") + 1 :].strip()

def doc_to_choice(doc):
    i = doc["sentence"].index("_")
    return [doc["sentence"][:i] + doc["option1"], doc["sentence"][:i] + doc["option2"]]
'''
OURS = {"local_arc": "arc_easy", "local_piqa": "piqa", "local_winogrande": "winogrande", "local_mmlu": "mmlu",
        "local_hellaswag": "hellaswag", "local_lambada": "lambada"}

RUN_LM_EVAL = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
hf, include, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={hf},dtype=float32", tasks=names,
                              task_manager=TaskManager(include_path=include), log_samples=True, batch_size=8,
                              device="cpu")
samples = {name: sorted(({"doc_id": s["doc_id"], "lls": [r[0] for r in s["filtered_resps"]],
                          "greedy": [bool(r[1]) for r in s["filtered_resps"]],
                          "acc": s["acc"], "acc_norm": s.get("acc_norm")} for s in out["samples"][name]),
                        key=lambda s: s["doc_id"]) for name in names}
print("LM_EVAL_SAMPLES " + json.dumps(samples))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Our tiny GPT-2-tokenizer run, its Hugging Face export, and the task files."""
    if not _gpt2_available():
        pytest.skip("GPT-2 BPE files not available offline (set TIKTOKEN_CACHE_DIR)")
    folder = tmp_path_factory.mktemp("lm_eval")
    model = perturbed_model(GPTConfig(block_size=BLOCK, vocab_size=50257, n_layer=2, n_head=2, n_embd=32), seed=5)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(10)  # predictions that differ clearly between tokens
    run = write_run(folder / "run", model, GPT2Tokenizer().to_dict())
    assert convert.main([str(run), str(folder / "hf"), "--to", "hf"]) == 0
    rows = {"arc_easy": ARC, "mmlu": [dict(r, subject="anatomy") for r in MMLU * 2],
            "lambada": LAMBADA + greedy_texts(model, GPT2Tokenizer())}
    files = {name: write_task(folder / "data", name, rows.get(name)) for name in OURS.values()}
    include = folder / "yaml"
    include.mkdir()
    for name, body in YAML.items():
        text = f"task: {name}\n" + textwrap.dedent(body).format(path=files[OURS[name]])
        (include / f"{name}.yaml").write_text(text)
    (include / "wino.py").write_text(WINO_FUNCTIONS)
    return run, folder / "hf", include, files


def greedy_texts(model, tok, wanted=3):
    """LAMBADA texts whose last word is the model's own greedy next token, so that some
    items are right (a random model rarely writes a text's real last word)."""
    out = []
    for text in (row["text"] for row in LAMBADA):
        words = text.split(" ")
        for k in range(3, len(words)):
            context = " ".join(words[:k])
            with torch.no_grad():
                token = int(model.next_token_logits(torch.tensor([tok.encode(context)[-BLOCK:]])).argmax())
            word = tok.decode([token])
            if word.startswith(" ") and word[1:].isalpha():
                out.append({"text": context + word})
            if len(out) == wanted:
                return out
    return out


def _gpt2_available():
    try:
        GPT2Tokenizer()
        return True
    except Exception:
        return False


def run_lm_eval(hf, include, names, home):
    env = dict(subprocess_env(), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(home), HF_DATASETS_CACHE=str(home / "datasets"), TOKENIZERS_PARALLELISM="false")
    result = subprocess.run([sys.executable, "-c", RUN_LM_EVAL, str(hf), str(include), ",".join(names)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("LM_EVAL_SAMPLES "))
    return json.loads(line.removeprefix("LM_EVAL_SAMPLES "))


@pytest.mark.slow
def test_choices_and_accuracy_equal_lm_evaluation_harness_item_by_item(exported, tmp_path):
    run, hf, include, files = exported
    theirs = run_lm_eval(hf, include, list(YAML), tmp_path / "hf_home")
    candidate = load_candidate(str(run))
    settings = Settings(torch.device("cpu"), torch.float32, progress=False)
    tok = candidate.tokenizer
    for local, name in OURS.items():
        task = tasks.TASKS[name]
        items = tasks.read_task(task, files[name])
        samples = theirs[local]
        assert [s["doc_id"] for s in samples] == list(range(len(items)))
        # the log likelihood of every continuation
        for item, sample in zip(items, samples):
            rows = task_scoring.rows_of(tok.encode, item.pairs, candidate.block_size, tok.eot_id)
            ours = task_scoring.score_rows(candidate.model, rows, settings.device, settings.autocast)
            assert [ll for ll, _ in ours] == pytest.approx(sample["lls"], rel=1e-5, abs=1e-3), (name, item.where)
            assert [g for _, g in ours] == sample["greedy"], (name, item.where)
        # the report card's choices, item by item, and so its accuracy
        line = report_card.score_task(candidate, task, items, settings)
        if task.kind == "word":
            assert [float(p) for p in line["predictions"]] == [s["acc"] for s in samples]
            assert 0 < line["acc"] < 1  # some last words written, some not: both sides are checked
        else:
            acc = [float(p[0] == it.gold) for p, it in zip(line["predictions"], items)]
            assert acc == [s["acc"] for s in samples], name
            if samples[0]["acc_norm"] is not None:
                norm = [float(p[1] == it.gold) for p, it in zip(line["predictions"], items)]
                assert norm == [s["acc_norm"] for s in samples], name
                assert line["acc_norm"] == pytest.approx(sum(norm) / len(norm))
        assert line["acc"] == pytest.approx(sum(s["acc"] for s in samples) / len(samples))
        assert line["skipped"] == 0
        if name == "arc_easy":  # not one answer everywhere: the choices themselves are compared
            assert len({p[0] for p in line["predictions"]}) > 1 and any(p[0] != p[1] for p in line["predictions"])


def test_long_items_are_cut_as_lm_eval_cuts_them(exported):
    """The MMLU prompts are longer than the block: both keep the last BLOCK + 1 tokens."""
    run, _, _, files = exported
    candidate = load_candidate(str(run))
    items = tasks.read_task(tasks.TASKS["mmlu"], files["mmlu"])
    rows = task_scoring.rows_of(candidate.tokenizer.encode, items[0].pairs, BLOCK)
    whole = candidate.tokenizer.encode(items[0].pairs[0][0] + items[0].pairs[0][1])
    assert len(whole) > BLOCK + 1 and rows[0][0] == whole[-(BLOCK + 1) :] and rows[0][1] == 1
