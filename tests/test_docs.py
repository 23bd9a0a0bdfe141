"""Documentation that is executed: every ```sh and ```python block of
README.md and docs/*.md runs here, as written, so a documented command that
stops working fails this test.

- A ```sh block runs as one ``bash -e -o pipefail`` script in a fresh
  directory, with .venv/bin first on the PATH, as root (``sudo`` is dropped:
  the blocks that use it need root, and the test is skipped without it).
  Each testbed the block makes (``testbed up --name NAME``) gets a name of
  its own for this run (NAME in the whole block is replaced), and is taken
  down afterwards whatever happened.
- A ```python block runs in a fresh interpreter in a fresh directory.
- ``<!-- docs-test: file NAME -->`` on the line before a block: the block
  is a file the others use (README.md's train.py): it is written as NAME
  into every block's directory instead of being run.
- ``<!-- docs-test: skip (REASON) -->`` on the line before a block: it
  cannot run here (real hosts, the whole test suite, a fragment); the test
  counts these and prints them (test_docs_skips_are_annotated_and_counted),
  and a skip without a reason fails.
- Sizes are scaled by HOMAGG_DOCS_SCALE (default 1/64): every ``--elements
  N`` becomes max(4096, N x scale), every ``--steps N`` max(1, N x scale),
  and ``homagg demo`` without --elements gets --elements 2^22 x scale (its
  network default).  HOMAGG_DOCS_SCALE=1 runs the documents' own sizes.

Other fences (toml, json, unlabelled output) are shown, not run.
"""

import math
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from helpers import require

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SCALE = float(os.environ.get("HOMAGG_DOCS_SCALE", "0.015625"))
ANNOTATION = re.compile(r"^<!--\s*docs-test:\s*(skip|file)\s*(.*?)\s*-->$")
VENV_BIN = str(pathlib.Path(sys.executable).parent)


class Block:
    def __init__(self, path, line, lang, text, note):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.kind, self.arg = note if note else ("run", "")

    @property
    def id(self):
        return f"{self.path.name}:{self.line}"


def blocks(path):
    """Every fenced block of a markdown file, with the annotation above it."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        note = None
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0:
            a = ANNOTATION.match(lines[k].strip())
            if a:
                note = (a.group(1), a.group(2).strip("() "))
        out.append(Block(path, start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n", note))
        i = j + 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]
RUNNABLE = [b for b in ALL if b.lang in ("sh", "python") and b.kind == "run"]
FILES = {b.arg: b.text for b in ALL if b.kind == "file"}


def _scaled(n, low):
    return max(low, int(math.floor(int(n) * SCALE)))


def prepare_sh(text, tag):
    """The block as this test runs it: sudo dropped, sizes scaled, testbed
    names made unique; returns (script, {doc name: unique name})."""
    text = re.sub(r"(?m)(^|[;&|]\s*|\s)sudo\s+", r"\1", text)
    text = re.sub(r"--elements (\d+)", lambda m: f"--elements {_scaled(m.group(1), 4096)}", text)
    text = re.sub(r"--steps (\d+)", lambda m: f"--steps {_scaled(m.group(1), 1)}", text)
    text = re.sub(
        r"(?m)^(homagg demo(?!.*--elements)[^#\n]*?)(\s*#.*)?$",
        lambda m: f"{m.group(1)} --elements {_scaled(2**22, 4096)}{m.group(2) or ''}",
        text,
    )
    names = {}
    for name in re.findall(r"testbed up [^\n#]*--name (\w+)", text):
        names.setdefault(name, f"d{tag}{name}"[:16])
    for name, new in names.items():
        text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", new, text)
    return text, names


def _write_files(cwd):
    for name, text in FILES.items():
        (cwd / name).write_text(text)


def _run(argv, cwd, timeout, env=None):
    p = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the block's own process group
        out, _ = p.communicate()
        pytest.fail(f"timed out after {timeout} s:\n{out[-4000:]}")
    return p.returncode, out


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.lang == "python"], ids=lambda b: b.id)
def test_python_block_runs(block, tmp_path):
    _write_files(tmp_path)
    (tmp_path / "block.py").write_text(block.text)
    rc, out = _run([sys.executable, "block.py"], tmp_path, 300)
    assert rc == 0, f"{block.id}:\n{block.text}\n{out[-4000:]}"


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.lang == "sh"], ids=lambda b: b.id)
def test_sh_block_runs(block, tmp_path):
    require(os.geteuid() == 0 or "sudo" not in block.text, "the block runs commands as root")
    script, names = prepare_sh(block.text, f"{os.getpid() % 1000}{block.line % 100}")
    _write_files(tmp_path)
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    try:
        rc, out = _run(["bash", "-e", "-o", "pipefail", "-c", script], tmp_path, 900, env)
    finally:
        for new in names.values():
            subprocess.run(
                [f"{VENV_BIN}/homagg", "-q", "testbed", "down", "--name", new],
                capture_output=True,
                timeout=120,
            )
    assert rc == 0, f"{block.id}, as run:\n{script}\n{out[-6000:]}"


def test_docs_skips_are_annotated_and_counted():
    skipped = [b for b in ALL if b.kind == "skip"]
    for b in skipped:
        assert b.arg, f"{b.id}: a docs-test skip needs a reason in parentheses"
        assert b.lang in ("sh", "python"), f"{b.id}: only sh and python blocks run anyway"
    notes = sum(
        len([ln for ln in p.read_text().splitlines() if ANNOTATION.match(ln.strip())]) for p in DOCS
    )
    assert notes == len(skipped) + len(FILES), "an annotation not right above a block"
    ran = [b for b in RUNNABLE]
    print(
        f"\ndocs: {len(ran)} blocks run ({sum(b.lang == 'sh' for b in ran)} sh, "
        f"{sum(b.lang == 'python' for b in ran)} python), {len(FILES)} file(s), "
        f"{len(skipped)} skipped:"
    )
    for b in skipped:
        print(f"  {b.id} ({b.lang}): {b.arg}")
    # the torchrun recipe is one of the blocks that run
    assert any("torchrun" in b.text and b.lang == "sh" for b in ran)
    assert "train.py" in FILES


def test_prepare_scales_and_renames():
    text = (
        "sudo homagg testbed up --workers 2 --name tb\n"
        "sudo ip netns exec hg-tb-w0 env F=/run/homagg/testbeds/tb.d/job.json x\n"
        "homagg demo --mode sim   # a comment\n"
        "homagg run allreduce --testbed tb --elements 4194304 --steps 10\n"
    )
    script, names = prepare_sh(text, "7")
    assert names == {"tb": "d7tb"}
    want_elements = max(4096, int(4194304 * SCALE))
    assert script.splitlines() == [
        "homagg testbed up --workers 2 --name d7tb",
        "ip netns exec hg-d7tb-w0 env F=/run/homagg/testbeds/d7tb.d/job.json x",
        f"homagg demo --mode sim --elements {max(4096, int(2**22 * SCALE))}   # a comment",
        f"homagg run allreduce --testbed d7tb --elements {want_elements} "
        f"--steps {max(1, int(10 * SCALE))}",
    ]


if __name__ == "__main__":  # list what would run
    for b in ALL:
        print(b.id, b.lang, b.kind, b.arg)
    sys.exit(0)
