"""eval.py --tasks: the standard tasks read in their publishers' formats, scored in
batches, and the report card (gptkit/evals/tasks.py, task_scoring.py, report_card.py)."""

import copy
import functools
import http.server
import json
import math
import threading

import pytest
import torch

import eval as eval_script
from gptkit.evals import report_card
from gptkit.evals import task_scoring
from gptkit.evals import tasks
from gptkit.data.chat import prompt_ids
from gptkit.ops.errors import UserError, run_main
from gptkit.evals.evaluation import Candidate, Settings
from gptkit.data.tokenizer import CharTokenizer
from model import GPTConfig
from task_files import ARC, FILES, GSM8K, write_rows, write_task
from train_helpers import perturbed_model, write_run

pytest.importorskip("pyarrow")  # reads the Hub's parquet files (a test dependency)

TEXT = ("".join(json.dumps(rows) for rows, _ in FILES.values()) + "ABCDEFGHIJKLMNOPQRSTUVWXYZ\n.-?!_$"
        + "Question: Answer: The following are multiple choice questions (with answers) about Which option fills")
CHARS = sorted(set(TEXT) - {"%"})  # "%" stays out: an item holding it cannot be encoded
SETTINGS = Settings(torch.device("cpu"), torch.float32, progress=False)


def sharp_model(vocab_size, seed=0, block_size=64):
    """A tiny random GPT whose predictions differ clearly between tokens (its embeddings
    scaled up), so that choosing between answers is not a matter of rounding."""
    model = perturbed_model(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=2, n_head=2,
                                      n_embd=32), seed=seed)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(10)
    return model


@pytest.fixture(scope="module")
def char_runs(tmp_path_factory):
    """Two character-level runs and a chat run (its vocabulary plus the 4 turn tokens)."""
    folder = tmp_path_factory.mktemp("runs")
    tok = CharTokenizer(CHARS).to_dict()
    a = write_run(folder / "a", sharp_model(len(CHARS), seed=1), tok)
    b = write_run(folder / "b", sharp_model(len(CHARS), seed=2), tok)
    chat = write_run(folder / "chat", sharp_model(len(CHARS) + 4, seed=3, block_size=256), tok)
    return a, b, chat


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks")
    for name in FILES:
        write_task(folder, name)
    return folder


def file_args(folder, names):
    out = []
    for name in names:
        out += ["--task_file", f"{name}={folder / name / FILES[name][1]}"]
    return out


def candidate(run):
    from gptkit.evals.evaluation import load_candidate

    return load_candidate(str(run))


def read(folder, name, rows=None):
    path = write_task(folder, name, rows) if rows is not None else folder / name / FILES[name][1]
    return tasks.read_task(tasks.TASKS[name], path)


# --- reading the publishers' formats ----------------------------------------------------


def test_each_format_reads_into_lm_eval_style_pairs(task_folder):
    arc = read(task_folder, "arc_easy")
    assert [len(it.pairs) for it in arc] == [4, 3, 5, 4, 4]
    assert [it.gold for it in arc] == [0, 1, 0, 1, 1]  # answerKey "2" of labels 1, 2, 3 is the second
    assert arc[0].pairs[0] == ("Question: Which of these is a planet?\nAnswer:", " Mars")
    original = [{"id": r["id"], "question": {"stem": r["question"], "choices": [
        {"text": t, "label": lab} for t, lab in zip(r["choices"]["text"], r["choices"]["label"])]},
        "answerKey": r["answerKey"]} for r in ARC]  # AI2's own ARC-Easy-Test.jsonl
    path = write_rows(task_folder / "ai2" / "ARC-Easy-Test.jsonl", original)
    assert [(it.pairs, it.gold) for it in tasks.read_task(tasks.TASKS["arc_easy"], path)] == \
        [(it.pairs, it.gold) for it in arc]
    piqa = read(task_folder, "piqa")
    assert piqa[1].pairs[1] == ("Question: How do I dry wet shoes?\nAnswer:",
                                " Stuff them with newspaper and leave them in a warm room.")
    wino = read(task_folder, "winogrande")[0]
    assert wino.pairs == [("The trophy did not fit in the suitcase because the trophy", " was too big."),
                          ("The trophy did not fit in the suitcase because the suitcase", " was too big.")]
    assert wino.gold == 0
    mmlu = read(task_folder, "mmlu")[1]
    assert mmlu.pairs[2][0] == ("The following are multiple choice questions (with answers) about anatomy.\n\n"
                                "Which organ pumps blood?\nA. lung\nB. liver\nC. heart\nD. skin\nAnswer:")
    assert [p[1] for p in mmlu.pairs] == [" A", " B", " C", " D"] and mmlu.gold == 2
    lam = read(task_folder, "lambada")[0]
    assert lam.pairs[0][1] == " umbrella" and lam.pairs[0][0].endswith("with a small")
    gsm = read(task_folder, "gsm8k")
    assert [it.gold for it in gsm] == ["7", "1205"]
    hs = read(task_folder, "hellaswag")[0]
    assert hs.gold == 3 and hs.pairs[3] == ("A man is sitting on a roof. he", " starts pulling up roofing on a roof.")


@pytest.mark.parametrize("layout", ["dictionary", "large_string", "dictionary_of_large_string"])
def test_text_columns_in_any_arrow_layout_read_the_same(task_folder, tmp_path, layout):
    """A pandas Categorical column is written as dictionary<string>; other writers use large_string."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in [n for n, (_, file_name) in FILES.items() if file_name.endswith(".parquet")]:
        table = pa.Table.from_pylist(FILES[name][0])
        for i, kind in enumerate(table.schema.types):
            if pa.types.is_string(kind):
                column = table.column(i).cast(pa.large_string() if "large" in layout else pa.string())
                table = table.set_column(i, table.field(i).name,
                                         column.dictionary_encode() if "dictionary" in layout else column)
        path = tmp_path / layout / name / FILES[name][1]
        path.parent.mkdir(parents=True)
        pq.write_table(table, path)
        assert any(pa.types.is_dictionary(t) or pa.types.is_large_string(t)
                   for t in pq.read_schema(path).types), (name, pq.read_schema(path))
        got = tasks.read_task(tasks.TASKS[name], path)
        want = read(task_folder, name)
        assert [(it.pairs, it.gold) for it in got] == [(it.pairs, it.gold) for it in want], name


@pytest.mark.parametrize("name, row, message", [
    ("arc_easy", {"question": "q?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"},
     "\"answerKey\" 'C' is not one of the labels"),
    ("arc_easy", {"choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "A"}, '"question"'),
    ("piqa", {"goal": "g", "sol1": "a", "sol2": "b", "label": 2}, '"label" must be 0 or 1'),
    ("winogrande", {"sentence": "no blank here", "option1": "a", "option2": "b", "answer": "1"}, 'no blank'),
    ("winogrande", {"sentence": "a _ b", "option1": "a", "option2": "b", "answer": "3"}, '"answer" must be "1" or "2"'),
    ("mmlu", {"question": "q", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 4}, '"answer" must be 0'),
    ("gsm8k", {"question": "q", "answer": "no mark"}, '"#### NUMBER"'),
    ("lambada", {"txt": "a b"}, '"text"'),
])
def test_a_bad_item_is_one_error_naming_the_file_and_item(tmp_path, name, row, message):
    rows = copy.deepcopy(FILES[name][0][:1]) + [row]
    path = write_task(tmp_path, name, rows)
    with pytest.raises(UserError) as e:
        tasks.read_task(tasks.TASKS[name], path)
    assert str(path) in str(e.value) and ("row 2" in str(e.value) or "line 2" in str(e.value))
    assert message in str(e.value)


def test_bad_files_and_names_exit_2_with_one_line(tmp_path, char_runs, capsys):
    run = str(char_runs[0])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    cases = [
        (["--tasks", "arc_easy", "--task_file", f"arc_easy={tmp_path / 'junk.parquet'}"], "not a readable parquet"),
        (["--tasks", "arc_easy", "--task_file", f"arc_easy={tmp_path / 'missing.parquet'}"], "does not exist"),
        (["--tasks", "arc_easy", "--task_file", f"arc_easy={tmp_path}"], "is not a file"),
        (["--tasks", "arc_easy", "--task_file", "arc_easy"], "write NAME=PATH"),
        (["--tasks", "arcc"], "unknown task 'arcc'"),
        (["--tasks", "piqa", "--task_file", f"arc_easy={tmp_path / 'x'}"], "which --tasks does not score"),
        (["--limit", "3", "--input", str(tmp_path / "junk.parquet")], "go with --tasks"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as e:
            run_main(eval_script.main, [run, *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err


# --- scoring ------------------------------------------------------------------------------


def test_batched_scores_equal_one_sequence_at_a_time_and_are_probabilities(char_runs, task_folder):
    """Every score is a sum of log probabilities of a distribution over the whole
    vocabulary (it sums to 1), and packing rows of different lengths into one padded
    pass changes nothing against the model run on each sequence alone."""
    cand = candidate(char_runs[0])
    tok = cand.tokenizer
    rows = [row for it in read(task_folder, "arc_easy") + read(task_folder, "piqa")
            for row in task_scoring.rows_of(tok.encode, it.pairs, cand.block_size)]
    kept = []
    batched = task_scoring.score_rows(cand.model, rows, SETTINGS.device, SETTINGS.autocast, batch_rows=7, keep=kept)
    distributions = torch.cat(kept)
    assert distributions.shape[1] == cand.model.config.vocab_size
    assert torch.allclose(distributions.exp().sum(1), torch.ones(len(distributions)), atol=1e-5)
    with torch.no_grad():
        for (tokens, n), (total, greedy) in zip(rows, batched):
            logits, _ = cand.model(torch.tensor([tokens[:-1]]))
            logp = torch.log_softmax(logits[0, -n:].double(), -1)
            target = torch.tensor(tokens[-n:])
            assert total == pytest.approx(float(logp.gather(1, target[:, None]).sum()), rel=1e-5, abs=1e-4)
            assert greedy == bool((logp.argmax(1) == target).all())


def test_scoring_never_looks_at_the_answer(char_runs, task_folder):
    """The predictions stay the same when the gold answers are permuted or replaced by
    nonsense; only the accuracy computed from them moves."""
    for run in (char_runs[0], char_runs[2]):  # a base model, and a chat model asked with letters
        cand = candidate(run)
        items = read(task_folder, "arc_easy")
        line = report_card.score_task(cand, tasks.TASKS["arc_easy"], items, SETTINGS)
        shuffled = [copy.copy(it) for it in items]
        for k, it in enumerate(shuffled):
            it.gold = (it.gold + 1 + k) % len(it.pairs)
        again = report_card.score_task(cand, tasks.TASKS["arc_easy"], shuffled, SETTINGS)
        assert again["predictions"] == line["predictions"]
        for it in shuffled:
            it.gold = None
        gone = report_card.score_task(cand, tasks.TASKS["arc_easy"], shuffled, SETTINGS)
        assert gone["predictions"] == line["predictions"] and gone["acc"] == 0
        expected = sum(p == it.gold for p, it in zip(
            [p[0] if isinstance(p, tuple) else p for p in line["predictions"]], items)) / len(items)
        assert line["acc"] == expected


class Sealed(tasks.Item):
    """An item whose gold answer cannot be read."""

    @property
    def gold(self):
        raise AssertionError("scoring read the gold answer")

    @gold.setter
    def gold(self, value):
        pass


def sealed(items):
    return [Sealed(it.where, it.pairs, None, it.question, it.options, it.choice_texts) for it in items]


def test_the_scorers_run_on_items_whose_answer_cannot_be_read(char_runs, task_folder):
    base, chat = candidate(char_runs[0]), candidate(char_runs[2])
    arc, lam = read(task_folder, "arc_easy"), read(task_folder, "lambada")
    _, picks, _ = report_card.base_choices(base, sealed(arc), SETTINGS, 32, None)
    assert picks == report_card.score_task(base, tasks.TASKS["arc_easy"], arc, SETTINGS)["predictions"]
    letters = task_scoring.chat_choices(chat.model, chat.tokenizer, sealed(arc), chat.block_size, SETTINGS.device,
                                        SETTINGS.autocast)
    assert letters == report_card.score_task(chat, tasks.TASKS["arc_easy"], arc, SETTINGS)["predictions"]
    _, rows, _ = report_card.rows_by_item(base.tokenizer, sealed(lam), base.block_size)
    assert len(task_scoring.score_rows(base.model, [r[0] for r in rows], SETTINGS.device, SETTINGS.autocast)) == 2


def test_a_chat_model_answers_with_the_letter_it_likes_best(char_runs, task_folder):
    cand = candidate(char_runs[2])
    tok = cand.tokenizer
    items = read(task_folder, "arc_easy")
    line = report_card.score_task(cand, tasks.TASKS["arc_easy"], items, SETTINGS)
    assert line["form"] == "chat" and line["metric"] == "acc"
    with torch.no_grad():
        for item, pick in zip(items, line["predictions"]):
            question = item.question + "".join(f"\n{L}. {o}" for L, o in zip("ABCDE", item.options))
            prompt = prompt_ids([{"role": "user", "content": question + "\nAnswer with the letter of the right "
                                  "answer."}], tok.encode, tok.vocab_size)
            logits = cand.model.next_token_logits(torch.tensor([prompt]))[0]
            letters = [tok.encode(L)[0] for L in "ABCDE"[: len(item.options)]]
            assert pick == int(logits[letters].argmax())


def test_a_chat_model_can_pick_any_letter_and_items_past_z_are_skipped_saying_why(char_runs, monkeypatch):
    """Letters past J were once never offered: an item of 14 answers is asked with A to N
    and any of them can win; one of 27 answers has no letter for its last and is skipped."""
    cand = candidate(char_runs[2])
    tok = cand.tokenizer
    def item(where, question, options):
        return tasks.Item(where, [(question, " " + o) for o in options], 0, question, options)

    many = [item(f"w{i}", f"Which one is {'xyzw'[i % 4] * (i + 1)}?", [f"answer {chr(97 + (k + i) % 26)}"
                                                                     for k in range(14)]) for i in range(8)]
    too_many = item("w27", "Which one?", [f"answer {chr(97 + k % 26)}{k // 26}" for k in range(27)])
    line = report_card.score_task(cand, tasks.TASKS["arc_easy"], many + [too_many], SETTINGS)
    assert line["items"] == len(many) and line["skipped"] == 1
    assert line["skipped_why"] == "1 item: more answers (27) than the letters A to Z to answer with"
    with torch.no_grad():
        for item, pick in zip(many, line["predictions"]):
            question = item.question + "".join(f"\n{L}. {o}" for L, o in zip("ABCDEFGHIJKLMN", item.options))
            prompt = prompt_ids([{"role": "user", "content": question + "\nAnswer with the letter of the right "
                                  "answer."}], tok.encode, tok.vocab_size)
            logits = cand.model.next_token_logits(torch.tensor([prompt]))[0]
            assert pick == int(logits[[tok.encode(L)[0] for L in "ABCDEFGHIJKLMN"]].argmax())
    # past J, the bug's blind spot: a model that likes M best answers M
    m = tok.encode("M")[0]
    liking_m = task_scoring.last_logits

    def last_logits(*args):
        logits = liking_m(*args)
        logits[:, m] += 1e4
        return logits

    monkeypatch.setattr(task_scoring, "last_logits", last_logits)
    line = report_card.score_task(cand, tasks.TASKS["arc_easy"], many, SETTINGS)
    assert line["predictions"] == [12] * len(many)


def test_gsm8k_is_scored_by_the_last_number_written(char_runs, task_folder, monkeypatch):
    """The base model continues "Question: ...\\nAnswer:" and the chat model replies to the
    question as a user turn; either way the last number in the text is compared."""
    assert tasks.normal_number("so 3 + 4 = 7 apples.") == "7"
    assert tasks.normal_number("It costs $1,205.00") == "1205"
    assert tasks.normal_number("no number") is None
    written = iter(["He has 3 + 4 = 7 apples.", "It is 1,200 + 5 = 1,206 dollars"] * 2)
    prompts = []

    def fake_generate(model, prompt, max_new, stop_ids, stop_texts, decode, device, autocast):
        prompts.append((prompt, stop_ids, stop_texts))
        return next(written)

    monkeypatch.setattr(task_scoring, "generate_greedy", fake_generate)
    items = read(task_folder, "gsm8k")
    base = report_card.score_task(candidate(char_runs[0]), tasks.TASKS["gsm8k"], items, SETTINGS)
    assert base["predictions"] == ["7", "1206"] and base["acc"] == 0.5
    chat_cand = candidate(char_runs[2])
    chat = report_card.score_task(chat_cand, tasks.TASKS["gsm8k"], items, SETTINGS)
    assert chat["form"] == "chat" and chat["acc"] == 0.5
    tok = chat_cand.tokenizer
    assert prompts[0][0] == tok.encode(f"Question: {GSM8K[0]['question']}\nAnswer:")[-64:]  # the base model's block
    assert prompts[0][2] == ("\n\n", "Question:")
    assert prompts[2][0] == prompt_ids([{"role": "user", "content": GSM8K[0]["question"]}], tok.encode,
                                       tok.vocab_size)
    assert set(prompts[2][1]) == set(range(tok.vocab_size, tok.vocab_size + 4))  # stops at a turn token


def test_gsm8k_generation_runs_on_a_real_model(char_runs, task_folder):
    for run in (char_runs[0], char_runs[2]):
        line = report_card.score_task(candidate(run), tasks.TASKS["gsm8k"], read(task_folder, "gsm8k"), SETTINGS)
        assert line["items"] == 2 and line["acc"] in (0, 0.5, 1)


# --- the report card ---------------------------------------------------------------------


def test_report_card_side_by_side_with_json_and_skipped_items(tmp_path, char_runs, task_folder, capsys):
    names = ["arc_easy", "piqa", "winogrande", "lambada", "hellaswag"]
    bad = copy.deepcopy(FILES["piqa"][0]) + [{"goal": "50% off?", "sol1": "yes", "sol2": "no", "label": 0}]
    folder = tmp_path / "t"
    for name in names:
        write_task(folder, name, bad if name == "piqa" else None)
    out = tmp_path / "card.json"
    code = eval_script.main([str(char_runs[0]), str(char_runs[1]), "--tasks", ",".join(names), "--json", str(out),
                             "--no_progress", *file_args(folder, names)])
    assert code == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    table = [line for line in lines[next(i for i, x in enumerate(lines) if x.startswith("| task |")) :]
             if line.startswith("| ")]
    assert table[0].startswith("| task | metric | random | a items | a acc | a centered | b items | b acc |")
    assert any(line.startswith("| PIQA | acc_norm | 50.00% | 3 (1 skipped) |") for line in table)
    assert "PIQA: skipped 1 of 4 items: the vocabulary lacks '%'" in printed.err
    doc = json.loads(out.read_text())
    cards = [m["tasks"] for m in doc["models"]]
    assert [t["task"] for t in cards[0]["tasks"]] == names
    for card in cards:
        centered = []
        for t in card["tasks"]:
            value = t[t["metric"]]
            assert t["centered"] == pytest.approx((value - t["random"]) / (1 - t["random"]))
            centered.append(t["centered"])
        assert card["summary"] == pytest.approx(sum(centered) / len(centered))
        summary_cell = f"**{100 * card['summary']:.2f}% ± {100 * card['summary_stderr']:.2f}**"
        assert summary_cell in table[-1]
    arc = cards[0]["tasks"][0]
    assert arc["random"] == pytest.approx((1 / 4 + 1 / 3 + 1 / 5 + 1 / 4 + 1 / 4) / 5)


def outcomes(line, items):
    """The 0/1 outcome of each scored item under the line's headline metric."""
    if line["metric"] == "acc" and isinstance(line["predictions"][0], bool):  # LAMBADA: written or not
        return [float(p) for p in line["predictions"]]
    which = 1 if line["metric"] == "acc_norm" else 0
    return [float(p[which] == it.gold) for p, it in zip(line["predictions"], items)]


def test_standard_errors_are_lm_evaluation_harness_s_and_propagate_to_the_summary(char_runs, task_folder):
    lm_metrics = pytest.importorskip("lm_eval.api.metrics")
    rng = torch.Generator().manual_seed(0)
    for n in (2, 3, 10, 57, 400):  # the formula is lm-eval's mean_stderr of 0/1 outcomes, at any n and p
        flags = (torch.rand(n, generator=rng) < torch.rand(1, generator=rng)).float().tolist()
        p = sum(flags) / n
        assert report_card.binomial_stderr(p, n) == pytest.approx(lm_metrics.mean_stderr(flags), rel=1e-9, abs=1e-12)
        assert report_card.binomial_stderr(p, n) == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))
    assert math.isnan(report_card.binomial_stderr(1.0, 1))  # one item: no spread to measure

    names = ["arc_easy", "piqa", "winogrande", "lambada", "hellaswag"]
    read_items = {name: read(task_folder, name) for name in names}
    card = report_card.score_tasks(candidate(char_runs[0]), [(tasks.TASKS[n], read_items[n]) for n in names],
                                   SETTINGS, 32, lambda *args: None)
    stderr_of_mean = lm_metrics.stderr_for_metric(lm_metrics.mean, bootstrap_iters=1000)  # what lm-eval calls
    errors = []
    for name, line in zip(names, card["tasks"]):
        if line["items"] < 2:
            assert math.isnan(line["stderr"]) and math.isnan(card["summary_stderr"])
            continue
        flags = outcomes(line, read_items[name])
        assert line[line["metric"]] == pytest.approx(sum(flags) / len(flags))
        assert line["stderr"] == pytest.approx(stderr_of_mean(flags), rel=1e-9, abs=1e-12), name
        assert line["centered_stderr"] == pytest.approx(line["stderr"] / (1 - line["random"]))
        errors.append(line["centered_stderr"])
    assert any(e > 0 for e in errors)
    lines = [line for line in card["tasks"] if line["items"] >= 2]
    assert report_card.summary_stderr(lines) == pytest.approx(math.sqrt(sum(e * e for e in errors)) / len(errors))


def test_limit_and_named_sets(tmp_path, char_runs, task_folder):
    assert tasks.parse_names("core") == list(tasks.SETS["core"])
    assert tasks.parse_names("chat,arc_easy,piqa") == ["arc_easy", "arc_challenge", "mmlu", "gsm8k", "piqa"]
    out = tmp_path / "card.json"
    assert eval_script.main([str(char_runs[0]), "--tasks", "arc_easy", "--limit", "2", "--json", str(out),
                             "--no_progress", *file_args(task_folder, ["arc_easy"])]) == 0
    assert json.loads(out.read_text())["models"][0]["tasks"]["tasks"][0]["items"] == 2


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tmp_path):
    """A local HTTP server laid out as the Hub: /datasets/REPO/resolve/main/FILE."""
    root = tmp_path / "hub"
    for name, task in tasks.TASKS.items():
        if name in ("arc_easy", "lambada", "hellaswag"):
            rows = FILES[name][0]
            if name == "hellaswag":  # the Hub's copy writes the label as a string
                rows = [dict(row, label=str(row["label"])) for row in rows]
            write_rows(root / "datasets" / task.repo / "resolve" / "main" / task.file, rows)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_tasks_are_fetched_by_name_once_into_the_cache(tmp_path, char_runs, hub, monkeypatch, capsys):
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "card.json"
    args = [str(char_runs[0]), "--tasks", "arc_easy,lambada,hellaswag", "--json", str(out), "--no_progress"]
    assert eval_script.main([*args, "--hub_url", hub]) == 0
    cached = tmp_path / "cache" / "tasks" / "arc_easy" / "test-00000-of-00001.parquet"
    assert cached.is_file() and (tmp_path / "cache" / "tasks" / "lambada" / "lambada_test_en.jsonl").is_file()
    assert (tmp_path / "cache" / "tasks" / "hellaswag" / "validation-00000-of-00001.parquet").is_file()
    first = json.loads(out.read_text())["models"][0]["tasks"]
    assert [t["items"] for t in first["tasks"]] == [5, 2, 2]  # HellaSwag from the mirror too
    # offline now (nothing listens there): the cached files are read
    assert eval_script.main([*args, "--hub_url", "http://127.0.0.1:9"]) == 0
    assert json.loads(out.read_text())["models"][0]["tasks"] == first
    with pytest.raises(UserError, match=r"could not download PIQA from http://127\.0\.0\.1:9/datasets/baber/piqa/"
                       r"resolve/main/piqa_validation\.parquet .*--task_file piqa=PATH"):
        eval_script.main([*args[:1], "--tasks", "piqa", "--hub_url", "http://127.0.0.1:9"])
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "empty"))  # nothing cached: its error names the flag
    with pytest.raises(UserError, match=r"could not download HellaSwag from http://127\.0\.0\.1:9/datasets/Rowan/"
                       r"hellaswag/.*--task_file hellaswag=PATH"):
        eval_script.main([*args[:1], "--tasks", "hellaswag", "--hub_url", "http://127.0.0.1:9"])
    capsys.readouterr()


def test_urls_follow_hf_endpoint(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    assert tasks.TASKS["arc_challenge"].url() == ("https://mirror.example/datasets/allenai/ai2_arc/resolve/main/"
                                                   "ARC-Challenge/test-00000-of-00001.parquet")
    monkeypatch.delenv("HF_ENDPOINT")
    assert tasks.TASKS["gsm8k"].url().startswith("https://huggingface.co/datasets/openai/gsm8k/")
    assert not math.isnan(tasks.random_baseline(tasks.TASKS["piqa"], [tasks.Item("w", [("a", "b")] * 2, 0)]))


def test_a_chat_model_beside_a_base_model_says_which_metric_is_its_own(char_runs, task_folder, capsys):
    assert eval_script.main([str(char_runs[0]), str(char_runs[2]), "--tasks", "arc_easy,lambada", "--no_progress",
                             *file_args(task_folder, ["arc_easy", "lambada"])]) == 0
    out = capsys.readouterr().out
    arc = next(line for line in out.splitlines() if line.startswith("| ARC-Easy |"))
    assert arc.startswith("| ARC-Easy | acc_norm |") and "(acc, chat)" in arc
    lambada = next(line for line in out.splitlines() if line.startswith("| LAMBADA |"))
    assert "chat" not in lambada  # LAMBADA stays plain text for a chat model
