"""The documentation stays true to the repository: every relative link resolves,
the README stays a front door, the tests the docs cite exist, and nothing in the
repository points at files a user does not have or at tracker numbers.

    python -m pytest tests/test_docs.py -q
"""

import re
import subprocess

import pytest
from repo import REPO

README_MAX_LINES = 250
MODEL_NAMED_WITHIN = 60  # "read model.py first" belongs on the first screen

# Built from pieces so that this file does not contain what it looks for.
OUTSIDE_PATHS = ("../" + "shared", "/" + "work/")
MISSING_FILE = "RELIABILITY" + ".md"  # its promises live in docs/reliability.md
TRACKER = re.compile(r"\b(?:issues?|tickets?|pull requests?|PRs?)\s*#?\d+", re.IGNORECASE)
# CI's offline copies of Tiny Shakespeare and tiktoken's files sit beside the
# repository on CI machines; finding them there is .ci/run's job and only its.
OUTSIDE_PATH_EXEMPT = {".ci/run"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def doc_files():
    return sorted(
        [REPO / "README.md", REPO / "BENCHMARKS.md", *(REPO / "docs").glob("*.md"), *(REPO / "benchmarks").glob("*.md")]
    )


def prose(text):
    """The text without code blocks and code spans, where a link is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    seen, out = {}, set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def repository_files():
    """Every file git tracks or would track (untracked but not ignored); without git
    (a copy of the work tree), every file outside hidden folders but .ci and .gitignore's."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True, timeout=60,
        ).stdout.decode().split("\0")
        return [rel for rel in listed if rel]
    except (OSError, subprocess.SubprocessError):
        ignored = {"__pycache__", "data", "wandb"}
        return [
            path.relative_to(REPO).as_posix()
            for path in REPO.rglob("*")
            if not any(
                (part.startswith(".") and part != ".ci") or part in ignored or part.startswith("out")
                for part in path.relative_to(REPO).parts[:-1]
            )
        ]


def tracked_text_files():
    """The repository's text files, as (relative path, text)."""
    for rel in repository_files():
        path = REPO / rel
        if not path.is_file():
            continue  # deleted in the work tree
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield rel, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_there_are_docs_to_check():
    names = {p.relative_to(REPO).as_posix() for p in doc_files()}
    assert {"README.md", "BENCHMARKS.md", "benchmarks/LOG.md", "docs/reliability.md"} <= names


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(doc):
    problems = []
    for target in LINK.findall(prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if REPO.resolve() not in path.parents and path != REPO.resolve():
            problems.append(f"{target} leads outside the repository")
        elif not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: {path.name} has no heading with the anchor #{anchor}")
    assert problems == [], f"{doc.relative_to(REPO)}: " + "; ".join(problems)


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    first = next((i for i, line in enumerate(lines, 1) if "model.py" in line), None)
    assert first is not None and first <= MODEL_NAMED_WITHIN, f"README.md names model.py first at line {first}"


def test_ci_runs_exactly_the_readmes_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = "python -m pip install -r requirements.txt -r requirements-test.txt && python -m pytest"
    assert f"```bash\n{command}\n```" in readme
    ci_lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci_lines


def test_tests_the_docs_cite_exist():
    cited = [m for doc in doc_files() for m in CITED_TEST.findall(doc.read_text(encoding="utf-8"))]
    assert len(cited) >= 30  # docs/reliability.md names the tests behind each promise
    missing = []
    for rel, name in cited:
        path = REPO / rel
        if not path.is_file() or not re.search(rf"^\s*def {name}\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            missing.append(f"{rel}::{name}")
    assert missing == [], "the docs cite tests that do not exist: " + ", ".join(missing)


def test_no_file_points_outside_the_repository_or_at_tracker_numbers():
    problems = []
    for rel, text in tracked_text_files():
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{number}"
            if rel not in OUTSIDE_PATH_EXEMPT:
                problems += [f"{where}: {p!r}" for p in OUTSIDE_PATHS if p in line]
            if MISSING_FILE in line:
                problems.append(f"{where}: cites {MISSING_FILE}, which is not in the repository (use docs/reliability.md)")
            problems += [f"{where}: tracker reference {m!r}" for m in TRACKER.findall(line)]
    assert problems == [], "\n".join(problems)
