"""Small task files in their publishers' exact formats (field names, answer keys, file
names), for tests/test_tasks.py and tests/test_tasks_lm_eval.py."""

import json

ARC = [
    {"id": "Mercury_1", "question": "Which of these is a planet?",
     "choices": {"text": ["Mars", "the Sun", "a comet", "the Moon"], "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
    {"id": "Mercury_2", "question": "At what temperature does water boil at sea level?",
     "choices": {"text": ["0 degrees", "100 degrees", "50 degrees"], "label": ["1", "2", "3"]}, "answerKey": "2"},
    {"id": "NYSEDREGENTS_3", "question": "What do plants need to make food?",
     "choices": {"text": ["sunlight", "sand", "salt", "snow", "smoke"], "label": ["A", "B", "C", "D", "E"]},
     "answerKey": "A"},
    {"id": "ACTAAP_4", "question": "Which tool measures mass?",
     "choices": {"text": ["a ruler", "a balance", "a thermometer", "a clock"], "label": ["A", "B", "C", "D"]},
     "answerKey": "B"},
    {"id": "MCAS_5", "question": "What is the main gas in the air we breathe?",
     "choices": {"text": ["oxygen", "nitrogen", "helium", "carbon dioxide"], "label": ["A", "B", "C", "D"]},
     "answerKey": "B"},
]

PIQA = [
    {"goal": "To open a jar,", "sol1": "twist the lid.", "sol2": "paint the lid.", "label": 0},
    {"goal": "How do I dry wet shoes?", "sol1": "Put them in the freezer overnight.",
     "sol2": "Stuff them with newspaper and leave them in a warm room.", "label": 1},
    {"goal": "keep bread fresh", "sol1": "seal it in a bag", "sol2": "leave it in the rain", "label": 0},
]

WINOGRANDE = [
    {"sentence": "The trophy did not fit in the suitcase because _ was too big.", "option1": "the trophy",
     "option2": "the suitcase", "answer": "1"},
    {"sentence": "Sarah lent her book to Maria because _ had finished reading it.", "option1": "Sarah",
     "option2": "Maria", "answer": "1"},
    {"sentence": "The cup broke when it fell on the floor because _ was hard.", "option1": "the cup",
     "option2": "the floor", "answer": "2"},
]

MMLU = [
    {"question": "What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1},
    {"question": "Which organ pumps blood?", "subject": "anatomy", "choices": ["lung", "liver", "heart", "skin"],
     "answer": 2},
]

LAMBADA = [
    {"text": "She opened the door and saw her old friend standing in the rain with a small umbrella"},
    {"text": "He poured the coffee into the cup and handed it to his sister"},
]

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A book costs $1,200 and a pen costs $5. What do both cost?",
     "answer": "1,200 + 5 = <<1200+5=1205>>1205\n#### 1,205"},
]

HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "split": "val", "label": 3},
    {"ind": 92, "activity_label": "Clean and jerk",
     "ctx": "A lady walks to a barbell. She bends down and grabs the pole. the lady",
     "endings": ["swings and lands in her arms.", "pulls the barbell forward.", "pulls a rope attached to the barbell.",
                 "stands and lifts the weight over her head."], "split": "val", "label": 3},
]

# The task, its rows, and the file name the publisher gives it.
FILES = {
    "arc_easy": (ARC, "test-00000-of-00001.parquet"),
    "arc_challenge": (ARC[:3], "test-00000-of-00001.parquet"),
    "piqa": (PIQA, "piqa_validation.parquet"),
    "winogrande": (WINOGRANDE, "validation-00000-of-00001.parquet"),
    "mmlu": (MMLU, "test-00000-of-00001.parquet"),
    "lambada": (LAMBADA, "lambada_test_en.jsonl"),
    "gsm8k": (GSM8K, "test-00000-of-00001.parquet"),
    "hellaswag": (HELLASWAG, "hellaswag_val.jsonl"),
}


def write_rows(path, rows):
    """rows as the publisher stores them: parquet (as the Hub's files) or JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_task(folder, name, rows=None):
    default_rows, file_name = FILES[name]
    return write_rows(folder / name / file_name, default_rows if rows is None else rows)
