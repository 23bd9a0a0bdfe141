"""The package's layout: every folder of modules is a regular package, so a
wheel (not only an editable install) carries it, and the console script's
target imports."""

import importlib
import os

import homagg

ROOT = os.path.dirname(homagg.__file__)


def test_every_module_folder_is_a_package_and_imports():
    folders = []
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            folders.append(here)
            assert "__init__.py" in files, f"{here} holds modules but no __init__.py"
    assert len(folders) >= 8, folders
    for here in folders:
        rel = os.path.relpath(here, os.path.dirname(ROOT)).replace(os.sep, ".")
        importlib.import_module(rel)


def test_console_script_target():
    from homagg.cli import main

    assert callable(main)


def test_every_exception_class_is_in_errors():
    """One exception tree (homagg.errors): no other module of the package
    defines a class deriving from an exception; the classes a module used to
    define stay importable from it and are errors.py's."""
    import ast

    from homagg import errors

    tree = {
        n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)
    }
    elsewhere = []
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            path = os.path.join(here, f)
            if not f.endswith(".py") or path == errors.__file__:
                continue
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & (
                    tree
                    | {
                        "Exception",
                        "BaseException",
                        "ValueError",
                        "RuntimeError",
                        "OSError",
                        "TimeoutError",
                        "KeyError",
                        "TypeError",
                    }
                ):
                    elsewhere.append(f"{os.path.relpath(path, ROOT)}: {node.name}")
    assert elsewhere == []
    from homagg.switch import job_file
    from homagg.train import train

    assert job_file.ConfigError is errors.ConfigError
    assert train.TrainError is errors.TrainError


def test_no_test_imports_conftest():
    """Fixtures live in conftest.py and helper functions in helpers.py.
    conftest.py is pytest's to load (under --import-mode=importlib it is not
    importable by name at all), so no test imports it."""
    import ast

    tests = os.path.dirname(os.path.abspath(__file__))
    offenders = []
    for f in sorted(os.listdir(tests)):
        if not f.endswith(".py"):
            continue
        path = os.path.join(tests, f)
        for node in ast.walk(ast.parse(open(path).read(), path)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "conftest" in names:
                offenders.append(f"{f}:{node.lineno}")
    assert offenders == [], f"import helpers instead of conftest: {offenders}"


def test_no_test_file_imports_another():
    """What several test files share lives in helpers.py, reference.py or a
    *_rig.py module: a test file imported by another is collected twice in
    spirit (its module-level state and marks leak) and hides a dependency."""
    import ast

    tests = os.path.dirname(os.path.abspath(__file__))
    offenders = []
    for f in sorted(os.listdir(tests)):
        if not f.endswith(".py"):
            continue
        path = os.path.join(tests, f)
        for node in ast.walk(ast.parse(open(path).read(), path)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{f}:{node.lineno} {n}" for n in names if n and n.split(".")[0].startswith("test_")
            ]
    assert offenders == [], f"move what is shared to a helper module: {offenders}"
