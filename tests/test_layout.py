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
