"""The layout: scripts at the root, their parts in the gptkit package, which
imports from anywhere without side effects."""

import ast
import dataclasses
import os
import subprocess
import sys
import textwrap

from repo import REPO

ROOT_SCRIPTS = {"prepare.py", "train.py", "sample.py", "model.py", "eval.py", "lab.py", "bench.py", "convert.py", "serve.py",
                "rl.py", "pipeline.py"}


def package_modules():
    """Every module of gptkit, as dotted names."""
    names = []
    for path in sorted((REPO / "gptkit").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_root_holds_only_what_a_user_runs():
    assert {p.name for p in REPO.glob("*.py")} == ROOT_SCRIPTS


def test_package_imports_from_another_folder_without_side_effects(tmp_path):
    """`import gptkit` and every module in it: no output, no device query, no files
    written; the bare package does not even import torch."""
    code = textwrap.dedent(
        f"""
        import importlib, sys
        import gptkit
        assert "torch" not in sys.modules, "import gptkit pulled in torch"
        import torch
        def no_query(*a, **k):
            raise AssertionError("a module asked for a device at import time")
        torch.cuda.is_available = no_query
        torch.cuda.device_count = no_query
        for name in {package_modules()!r}:
            importlib.import_module(name)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_package_never_imports_a_root_script_but_the_model():
    """The package is what the scripts are built of, never the other way round;
    model.py is the one root file it uses (the GPT is read at the root)."""
    assert imports_of_root_scripts(sorted((REPO / "gptkit").rglob("*.py"))) == []


def imports_of_root_scripts(paths):
    """['file:line imports script', ...]: each import of a root script but model.py in `paths`
    (imports inside functions too)."""
    scripts = {name[:-3] for name in ROOT_SCRIPTS} - {"model"}
    problems = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found = [node.module]
            else:
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            problems += [f"{where} imports {m}" for m in found if m.split(".")[0] in scripts]
    return problems


def test_prepare_does_not_import_torch(tmp_path):
    """prepare.py streams gigabytes in bounded memory: torch alone would add ~200 MB to it."""
    code = "import sys, prepare; assert 'torch' not in sys.modules, 'prepare.py imports torch'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_model_imports_only_torch_and_its_settings():
    """model.py is the architecture: speed swaps (gptkit/fast/fused.py) are applied to a
    built model from outside, and generation policies live in gptkit/generation/generate.py."""
    allowed = {"math", "dataclasses", "torch", "torch.nn", "torch.nn.functional", "gptkit.config"}
    imported = set()
    for node in ast.walk(ast.parse((REPO / "model.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= allowed, f"model.py imports {sorted(imported - allowed)}"


def project_imports():
    """{module: the project modules it imports}, over the root scripts and gptkit, counting
    imports inside functions too (a deferred import is still a dependency)."""
    paths = [REPO / name for name in sorted(ROOT_SCRIPTS)] + sorted((REPO / "gptkit").rglob("*.py"))
    modules = {}
    for path in paths:
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = sorted(m for m in found if m in modules and m != name)
    return graph


def test_no_import_cycle_among_the_projects_modules():
    """Each module can be read before the ones that use it: the first cycle found is named."""
    graph, done, path = project_imports(), set(), []

    def visit(name):
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        path.append(name)
        for dep in graph[name]:
            cycle = visit(dep)
            if cycle:
                return cycle
        path.pop()
        done.add(name)
        return None

    cycles = [c for c in map(visit, sorted(graph)) if c]
    assert not cycles, "import cycle: " + " -> ".join(cycles[0])


def gptkit_names(tree):
    """The module-level names a script binds by importing from gptkit."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "gptkit":
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "gptkit"}
    return names


def test_the_training_step_calls_nothing_from_gptkit():
    """train_step reads in train.py alone: torch, the model, the batches and the
    optimizers' own methods, and the train.py functions it names (themselves held to
    the same rule), besides the two step helpers rl.py shares with it, gptkit/train/step.py's,
    held to the same rule. Set-up and I/O stay in gptkit; the step does not reach into it."""
    tree = ast.parse((REPO / "train.py").read_text(encoding="utf-8"))
    helpers = ast.parse((REPO / "gptkit" / "train" / "step.py").read_text(encoding="utf-8"))
    shared = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
              and node.module == "gptkit.train.step" for a in node.names}
    functions = {node.name: node for t in (tree, helpers) for node in t.body if isinstance(node, ast.FunctionDef)}
    assert gptkit_names(helpers) == set() and shared <= functions.keys()
    banned, seen, todo, problems = gptkit_names(tree) - shared, set(), ["train_step"], []
    while todo:
        name = todo.pop()
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in banned:
                    problems.append(f"{name} uses {node.id} (line {node.lineno})")
                elif node.id in functions and node.id not in seen:
                    todo.append(node.id)
    assert "clip_gradients" in seen and "set_lr" in seen  # the rule reaches what the step calls
    assert problems == []


def test_root_scripts_never_import_each_other_but_the_model():
    """Each root script is a command built of gptkit, not of another command: what two
    of them share lives in the package (rl.py's step helpers: gptkit/train/step.py).
    model.py is the one root file they all read. Imports inside functions count too."""
    assert imports_of_root_scripts([REPO / name for name in sorted(ROOT_SCRIPTS)]) == []


def test_run_state_is_assigned_only_by_the_loop_and_its_own_methods():
    """Every change to the loop's state is visible in train.py's loop or in RunState's
    methods (gptkit/run_state.py): the checkpointer and the logger only read it.
    (Another class's own attribute of the same name, self.iter_num, is its own.)"""
    from gptkit.run_state import RunState

    fields = {f.name for f in dataclasses.fields(RunState)}
    allowed = {REPO / "train.py", REPO / "gptkit" / "run_state.py", REPO / "rl.py", "pipeline.py"}  # rl.py: its own loop
    paths = [REPO / name for name in sorted(ROOT_SCRIPTS)] + sorted((REPO / "gptkit").rglob("*.py"))
    problems = []
    for path in paths:
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1:
                name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
                if name in fields:
                    problems.append(f"{path.relative_to(REPO)}:{node.lineno} setattr(..., {name!r})")
            for target in targets:
                for sub in ast.walk(target):
                    own = isinstance(sub, ast.Attribute) and getattr(sub.value, "id", None) == "self"
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and sub.attr in fields and not own:
                        problems.append(f"{path.relative_to(REPO)}:{node.lineno} assigns .{sub.attr}")
    assert problems == []


def test_only_train_py_steps_around_the_model():
    """The step calls the model itself: no module but train.py defines
    require_backward_grad_sync (DDP's switch, train.py's Forward passes it on) or a
    __call__(x, y) that runs around the model's forward (a loss wrapper would hide a
    second step inside the first)."""
    problems = []
    for path in [REPO / name for name in sorted(ROOT_SCRIPTS - {"train.py"})] + sorted((REPO / "gptkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                args = [a.arg for a in node.args.args]
                if node.name == "require_backward_grad_sync":
                    problems.append(f"{path.relative_to(REPO)}:{node.lineno} defines require_backward_grad_sync")
                if node.name == "__call__" and args[1:] == ["x", "y"]:
                    problems.append(f"{path.relative_to(REPO)}:{node.lineno} wraps the model's forward (x, y)")
    assert problems == []


def test_train_py_reads_from_the_top():
    """train_step within the first 180 lines, run() within 90, and no chat branch in it:
    the reader (gptkit/data/dataset.py's open_batches) is what differs for chat data."""
    tree = ast.parse((REPO / "train.py").read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert functions["train_step"].lineno <= 180
    run = functions["run"]
    assert run.end_lineno - run.lineno + 1 <= 90
    names = {n.id for n in ast.walk(run) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(run) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(run) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not any("chat" in name.lower() for name in names) and "chat" not in strings


def test_the_package_top_level_never_imports_training():
    """Sampling, evaluation and export read checkpoints through gptkit/ alone
    (gptkit/ops/sharded.py, gptkit/run_state.py): no gptkit/*.py module imports gptkit.train."""
    graph = project_imports()
    problems = [f"{name} imports {dep}" for name, deps in graph.items()
                if name.startswith("gptkit.") and not name.startswith("gptkit.train") and name.count(".") >= 1
                for dep in deps if dep.startswith("gptkit.train")]
    assert problems == []


def test_the_files_a_learner_reads_keep_lines_within_100_characters():
    long = [f"{name}:{i}" for name in ("model.py", "train.py", "sample.py")
            for i, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1) if len(line) > 100]
    assert long == []


def test_every_package_module_has_its_row_in_the_layout_doc():
    """docs/layout.md is the map a learner reads to know which modules to read and which to
    skip: every module of gptkit/ (and the int8 kernel's C file) is named in it."""
    doc = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    files = [p for p in (REPO / "gptkit").rglob("*") if p.suffix in {".py", ".c"} and p.name != "__init__.py"]
    missing = []
    for path in files:
        rel = path.relative_to(REPO / "gptkit")
        if f"`{rel.as_posix()}`" not in doc and f"`{rel.name}`" not in doc:  # prepare/, interop/: by name
            missing.append(rel.as_posix())
    assert missing == []


def test_the_model_shapes_module_imports_only_the_model():
    """Sampling, serving, LoRA and loading find the model's parts through
    gptkit/models/shapes.py: it imports model.py (and errors.py, which imports nothing of
    ours), so none of them pulls in the dataset reader or lab.py's report."""
    graph = project_imports()
    assert set(graph["gptkit.models.shapes"]) <= {"model", "gptkit.ops.errors"}
    assert [m for m in graph["gptkit.ops.errors"] if m.split(".")[0] in {"gptkit", "model"}] == []
    for name in ("sample", "serve", "gptkit.models.lora", "gptkit.models.loading", "gptkit.generation.generate"):
        seen, todo = set(), [name]
        while todo:
            for dep in graph[todo.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        assert not seen & {"gptkit.data.dataset", "gptkit.models.params"}, name


def test_the_import_graph_is_at_most_twelve_layers_deep():
    """The longest chain of imports among the project's modules (a root script at the top,
    a module importing nothing of ours at the bottom) holds at most 12 modules: a learner
    following an import from a script reaches the bottom in a few steps. It was 17 before
    gptkit was grouped by role and rl.py stopped importing train.py."""
    graph, depth = project_imports(), {}

    def layers(name):
        if name not in depth:
            depth[name] = 1 + max((layers(dep) for dep in graph[name]), default=0)
        return depth[name]

    deepest = max(graph, key=layers)
    assert layers(deepest) <= 12, deepest
