"""Provision real testbed hosts over SSH (fabric): packages, Python env, HomAgg, hugepages, NIC.

    homagg provision -i testbed.toml [--dry-run] [--hosts h1,h2]

First a preflight on every selected host (SSH login with the inventory's key,
root or passwordless sudo, Debian/Ubuntu): if any host fails it, nothing is
changed and one error names each failing host and the fix.  Then every host
runs these steps in parallel, each checking the current state first and
reporting "changed" or "ok" (so a second run changes nothing and says so):

  os          Debian or Ubuntu
  packages    apt-get install of the missing packages (none when all present)
  venv        python3 -m venv INSTALL_DIR/venv
  upload      the project sdist/wheel to INSTALL_DIR/dist (by content digest)
  wheels      the wheelhouse (every dependency as a wheel, downloaded here) to
              INSTALL_DIR/wheels, so hosts need no package index (pip_index = false)
  build       sdist: unpack to INSTALL_DIR/src, make lib (+ switch on the aggregator)
  install     pip install into the venv
  hugepages   reserve hugepages (aggregator; never lowers a larger reservation)
  hugetlbfs   mount hugetlbfs at hugepages_mount (aggregator)
  nic_bind    bind the PCI NIC to its DPDK driver (dpdk-devbind.py); vdev/iface: nothing
  mtu         the inventory's mtu on the data-plane kernel interface (iface, or a
              vdev's iface=); a PCI NIC gets it from the daemon's --mtu
  address     the data-plane address on a worker's kernel interface
  config      the host's config file (config_file, TOML)
  secret      a worker: the inventory's auth_secret (a job secret file here,
              created when missing) as INSTALL_DIR/secret/job.secret, mode
              0600, by SFTP (homagg.deploy.remote.secret); nothing without one

A host whose step fails skips its remaining steps; the other hosts go on.
The run ends with a per-host table and, if any host failed, one
ProvisionError carrying every failed host, its step and its stderr tail.
The inventory format is in docs/INVENTORY.md.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import homagg
from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import secret as hsecret
from homagg.deploy.remote.progress import StepView
from homagg.deploy.remote.ssh import (
    CHANGED,
    FAILED,
    OK,
    SKIPPED,
    WOULD,
    PreflightError,  # noqa: F401
    ProvisionError,
    Session,
    StepFailed,
    StepResult,
    format_table,
    failure_message,
    parallel,
    preflight_all,
)
from homagg.deploy.remote.ssh import tail as _tail
from homagg.errors import HomAggError

STEPS = (
    "os",
    "packages",
    "venv",
    "upload",
    "wheels",
    "build",
    "install",
    "hugepages",
    "hugetlbfs",
    "nic_bind",
    "mtu",
    "address",
    "config",
    "secret",
)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(homagg.__file__))))


# --------------------------------------------------------------------------
# The project artifact


def build_sdist(outdir: str, python: str | None = None) -> str:
    """Build an sdist of this checkout into ``outdir``; returns its path."""
    os.makedirs(outdir, exist_ok=True)
    before = set(os.listdir(outdir))
    cp = subprocess.run(
        [python or sys.executable, "setup.py", "-q", "sdist", "-d", outdir],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if cp.returncode != 0:
        raise ProvisionError(
            f"building the sdist in {REPO} failed:\n{_tail(cp.stderr)}",
            [("localhost", "sdist", "build failed", _tail(cp.stderr))],
        )
    new = sorted(set(os.listdir(outdir)) - before) or sorted(
        f for f in os.listdir(outdir) if f.endswith(".tar.gz")
    )
    return os.path.join(outdir, [f for f in new if f.endswith(".tar.gz")][-1])


def requirements() -> list[str]:
    """The package's run and build requirements (pyproject.toml)."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    return (
        list(meta["build-system"]["requires"])
        + list(meta["project"]["dependencies"])
        + list(meta["project"]["optional-dependencies"]["metrics"])
    )


def build_wheelhouse(outdir: str, python: str | None = None) -> str:
    """Download every requirement as a wheel into ``outdir`` (with this
    machine's pip, index and cache); the hosts install from it offline.  The
    hosts must share this machine's Python version and architecture."""
    os.makedirs(outdir, exist_ok=True)
    cp = subprocess.run(
        [
            python or sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--only-binary",
            ":all:",
            "-d",
            outdir,
            *requirements(),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if cp.returncode != 0:
        raise ProvisionError(
            f"downloading the wheelhouse failed:\n{_tail(cp.stderr)}",
            [("localhost", "wheels", "pip download failed", _tail(cp.stderr))],
        )
    return outdir


def wheelhouse_digest(path: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name.endswith(".whl"):
            h.update(f"{name}\0{os.path.getsize(os.path.join(path, name))}\0".encode())
    return h.hexdigest()


def artifact_digest(path: str) -> str:
    """sha256 over the artifact's member names and contents (not the archive
    bytes, which carry timestamps): rebuilding the same tree gives the same
    digest, so a second run uploads nothing."""
    h = hashlib.sha256()
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as z:
            for name in sorted(z.namelist()):
                h.update(name.encode() + b"\0" + z.read(name) + b"\0")
    else:
        with tarfile.open(path) as t:
            members = sorted((m for m in t.getmembers() if m.isfile()), key=lambda m: m.name)
            for m in members:
                h.update(m.name.encode() + b"\0" + t.extractfile(m).read() + b"\0")
    return h.hexdigest()


def _sdist_topdir(path: str) -> str:
    with tarfile.open(path) as t:
        return t.getmembers()[0].name.split("/")[0]


# --------------------------------------------------------------------------
# One host


def host_config(h: inv.HostSpec, inventory: inv.Inventory, srcdir: str) -> str:
    """The TOML written to the host's config_file (read by the run commands)."""
    q = lambda v: '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
    s = inventory.settings
    lines = [
        "# Written by `homagg provision`; changes are overwritten on the next run.",
        "[host]",
        f"name = {q(h.name)}",
        f"role = {q(h.role)}",
        f"dataplane_ip = {q(h.dataplane_ip)}",
        f"mtu = {h.mtu}",
        f"cores = [{', '.join(map(str, h.cores))}]",
        f"install_dir = {q(h.install_dir)}",
        f"venv = {q(h.venv)}",
        f"source_dir = {q(srcdir)}",
        "",
        "[dataplane]",
    ]
    if h.pci:
        lines += [f"pci = {q(h.pci)}", f"driver = {q(h.driver)}"]
    elif h.vdev:
        lines += [f"vdev = {q(h.vdev)}"]
    else:
        lines += [f"iface = {q(h.iface)}"]
    if h.hugepages:
        lines += [
            "",
            "[hugepages]",
            f"count = {h.hugepages.count}",
            f"size = {q(h.hugepages.size)}",
            f"mount = {q(s.hugepages_mount.replace('{name}', h.name))}",
        ]
    for p in inventory.hosts:
        lines += [
            "",
            "[[peers]]",
            f"name = {q(p.name)}",
            f"role = {q(p.role)}",
            f"dataplane_ip = {q(p.dataplane_ip)}",
        ]
    return "\n".join(lines) + "\n"


class Change:
    """What a step found to change: ``would`` says it (a dry run reports
    only that), ``apply()`` does it (it may raise StepFailed), ``done``
    says what was done."""

    __slots__ = ("would", "apply", "done")

    def __init__(self, would: str, apply, done: str):
        self.would, self.apply, self.done = would, apply, done


class HostRun(Session):
    """The SSH session and the steps of one host."""

    def __init__(
        self,
        h: inv.HostSpec,
        inventory: inv.Inventory,
        artifact: str | None,
        digest: str | None,
        dry_run: bool,
        wheelhouse: str | None = None,
    ):
        super().__init__(h, inventory)
        self.wheelhouse = wheelhouse
        self.wh_digest = wheelhouse_digest(wheelhouse) if wheelhouse else None
        self.artifact = artifact
        self.digest = digest
        self.dry_run = dry_run
        self.secret = None  # the inventory's auth_secret, read by provision()

    # -- steps -------------------------------------------------------------------
    # Each checks first and returns (OK, detail) when nothing is to change,
    # else a Change (applied by run_step, never in a dry run); errors raise
    # StepFailed.

    def run_step(self, step):
        """(status, detail) of step: OK, WOULD (a dry run) or CHANGED."""
        r = getattr(self, f"step_{step}")()
        if not isinstance(r, Change):
            return r
        if self.dry_run:
            return WOULD, r.would
        r.apply()
        return CHANGED, r.done

    def step_os(self):
        return OK, self.os_name()

    def step_packages(self):
        pkgs = list(self.s.apt_packages["common"]) + list(self.s.apt_packages[self.h.role])
        if self.h.pci:
            pkgs.append("pciutils")
        fmt = "${Package} ${db:Status-Abbrev}\\n"
        r = self.run(f"dpkg-query -W -f='{fmt}' {' '.join(pkgs)} 2>/dev/null", check=False)
        installed = {ln.split()[0] for ln in r.stdout.splitlines() if ln.split()[1:2] == ["ii"]}
        missing = [p for p in pkgs if p not in installed]
        if not missing:
            return OK, f"{len(pkgs)} packages present"
        env = "DEBIAN_FRONTEND=noninteractive"
        return Change(
            "would apt-get install " + " ".join(missing),
            lambda: self.run(
                f"{env} apt-get -o DPkg::Lock::Timeout=600 update -qq && {env} apt-get "
                f"-o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends {' '.join(missing)}"
            ),
            "installed " + " ".join(missing),
        )

    def step_venv(self):
        py = f"{self.h.venv}/bin/python"
        if (
            self.run(f"{shlex.quote(py)} -c 'import sys, venv' 2>/dev/null", check=False).exited
            == 0
        ):
            return OK, f"{self.h.venv} exists"
        return Change(
            f"would create {self.h.venv}",
            lambda: self.run(
                f"mkdir -p {shlex.quote(self.h.install_dir)} && "
                f"{shlex.quote(self.s.python)} -m venv {shlex.quote(self.h.venv)}"
            ),
            f"created {self.h.venv} ({self.s.python})",
        )

    @property
    def dist_dir(self):
        return f"{self.h.install_dir}/dist"

    @property
    def remote_artifact(self):
        return f"{self.dist_dir}/{os.path.basename(self.artifact)}"

    @property
    def srcdir(self):
        if self.artifact.endswith(".whl"):
            return ""
        return f"{self.h.install_dir}/src/{_sdist_topdir(self.artifact)}"

    def _stamp(self, name):
        return f"{self.h.install_dir}/.{name}.digest"

    def _stamp_ok(self, name) -> bool:
        r = self.run(f"cat {shlex.quote(self._stamp(name))} 2>/dev/null", check=False)
        return r.exited == 0 and r.stdout.strip() == self.digest

    def _write_stamp(self, name):
        self.run(f"echo {self.digest} > {shlex.quote(self._stamp(name))}")

    def step_upload(self):
        short = self.digest[:12]
        name = os.path.basename(self.artifact)
        if (
            self._stamp_ok("upload")
            and self.run(f"test -f {shlex.quote(self.remote_artifact)}", check=False).exited == 0
        ):
            return OK, f"{name} ({short}) present"

        def apply():
            self.run(f"mkdir -p {shlex.quote(self.dist_dir)}")
            tmp = self.run("mktemp").stdout.strip()
            self.conn.put(self.artifact, tmp)
            self.run(
                f"install -m 0644 {shlex.quote(tmp)} {shlex.quote(self.remote_artifact)} && "
                f"rm -f {shlex.quote(tmp)}"
            )
            self._write_stamp("upload")

        return Change(
            f"would copy {name} ({short}) to {self.dist_dir}", apply, f"copied {name} ({short})"
        )

    def step_wheels(self):
        if not self.wheelhouse:
            return OK, "pip_index = true: the hosts install from the package index"
        dst = f"{self.h.install_dir}/wheels"
        stamp = f"{self.h.install_dir}/.wheels.digest"
        r = self.run(f"cat {shlex.quote(stamp)} 2>/dev/null", check=False)
        names = sorted(n for n in os.listdir(self.wheelhouse) if n.endswith(".whl"))
        if r.stdout.strip() == self.wh_digest:
            return OK, f"{len(names)} wheels present"

        def apply():
            self.run(f"rm -rf {shlex.quote(dst)} && mkdir -p {shlex.quote(dst)}")
            for n in names:
                self.conn.put(os.path.join(self.wheelhouse, n), f"{dst}/{n}")
            self.run(f"echo {self.wh_digest} > {shlex.quote(stamp)}")

        return Change(
            f"would copy {len(names)} wheels to {dst}",
            apply,
            f"copied {len(names)} wheels to {dst}",
        )

    def _make_targets(self):
        return "lib switch" if self.h.role == "aggregator" else "lib"

    def step_build(self):
        if self.artifact.endswith(".whl"):
            return OK, "wheel: built locally, nothing to build"
        targets = self._make_targets()
        if self._stamp_ok("build"):
            return OK, f"make {targets} done in {self.srcdir}"

        def apply():
            src, top = shlex.quote(self.srcdir), shlex.quote(os.path.dirname(self.srcdir))
            self.run(
                f"rm -rf {src} && mkdir -p {top} && "
                f"tar -xzf {shlex.quote(self.remote_artifact)} -C {top}"
            )
            self.run(f"make -C {src} --no-print-directory {targets}")
            self._write_stamp("build")

        return Change(
            f"would unpack into {self.srcdir} and make {targets}",
            apply,
            f"unpacked and ran make {targets}",
        )

    def step_install(self):
        pip = f"{self.h.venv}/bin/python -m pip"
        mods = "homagg._hg, homagg" + (", prometheus_client" if self.h.metrics_port else "")
        check = f"{self.h.venv}/bin/python -c 'import {mods}; print(homagg.__file__)'"
        if self._stamp_ok("install") and self.run(check, check=False).exited == 0:
            return OK, f"homagg ({self.digest[:12]}) importable in {self.h.venv}"
        extra = " ".join(map(shlex.quote, self.s.pip_args))
        if self.wheelhouse:
            extra = f"--no-index --find-links {shlex.quote(self.h.install_dir + '/wheels')} {extra}"
        # an aggregator serving metrics gets the extra homagg exporter needs
        want = "[metrics]" if self.h.metrics_port else ""
        if self.artifact.endswith(".whl"):
            target = shlex.quote(self.remote_artifact + want)
            envs = ""
        else:
            target = shlex.quote(self.srcdir + want)
            envs = f"HOMAGG_LIBDIR={shlex.quote(self.srcdir + '/build/release')} "
        pipq = f"{envs}{pip} install -q --disable-pip-version-check {extra}"
        if self.artifact.endswith(".whl"):  # same version installed: force it, then the deps
            cmd = f"{pipq} --force-reinstall --no-deps {target} && {pipq} {target}"
        else:  # a source directory is always rebuilt and reinstalled
            cmd = f"{pipq} {target}"

        def apply():
            self.run(f"cd {shlex.quote(self.h.install_dir)} && {cmd}")
            r = self.run(check, check=False)
            if r.exited != 0:
                raise StepFailed("homagg installed but does not import", _tail(r.stderr))
            self._write_stamp("install")

        return Change(
            f"would pip install homagg into {self.h.venv}",
            apply,
            f"installed homagg ({self.digest[:12]}) into {self.h.venv}",
        )

    def _hp_sysfs(self):
        return f"/sys/kernel/mm/hugepages/hugepages-{self.h.hugepages.size_kb}kB/nr_hugepages"

    def step_hugepages(self):
        hp = self.h.hugepages
        if self.h.role != "aggregator" or hp is None or hp.count == 0:
            return OK, "none requested"
        path = self._hp_sysfs()
        r = self.run(f"cat {path}", check=False)
        if r.exited != 0:
            raise StepFailed(
                f"{path} missing: the kernel has no {hp.size} hugepages "
                "(use size = '2M', or enable 1G pages with hugepagesz=1G at boot)",
                _tail(r.stderr),
            )
        have = int(r.stdout.strip())
        if have >= hp.count:
            return OK, f"{have} x {hp.size} reserved (>= {hp.count})"

        def apply():
            self.run(f"echo {hp.count} > {path}")
            now = int(self.run(f"cat {path}").stdout.strip())
            if now < hp.count:
                raise StepFailed(
                    f"the kernel reserved only {now} of {hp.count} x {hp.size} hugepages (memory "
                    f"fragmented): reserve them at boot (kernel command line hugepages={hp.count}) "
                    "or lower hugepages.count"
                )

        return Change(
            f"would reserve {hp.count} x {hp.size} (now {have})",
            apply,
            f"reserved {hp.count} x {hp.size} (was {have})",
        )

    def step_hugetlbfs(self):
        hp = self.h.hugepages
        if self.h.role != "aggregator" or hp is None or hp.count == 0:
            return OK, "none requested"
        mnt = self.s.hugepages_mount.replace("{name}", self.h.name)
        r = self.run("cat /proc/self/mounts")
        for ln in r.stdout.splitlines():
            f = ln.split()
            if len(f) >= 4 and f[1] == mnt and f[2] == "hugetlbfs":
                opts = dict(o.partition("=")[::2] for o in f[3].split(","))
                if opts.get("pagesize", "2M") == hp.size:
                    return OK, f"hugetlbfs (pagesize={hp.size}) mounted at {mnt}"
        return Change(
            f"would mount hugetlbfs pagesize={hp.size} at {mnt}",
            lambda: self.run(
                f"mkdir -p {shlex.quote(mnt)} && mount -t hugetlbfs -o pagesize={hp.size} "
                f"nodev {shlex.quote(mnt)}"
            ),
            f"mounted hugetlbfs (pagesize={hp.size}) at {mnt}",
        )

    def _iface_exists(self, ifname):
        if self.run(f"ip link show dev {shlex.quote(ifname)} >/dev/null", check=False).exited != 0:
            raise StepFailed(
                f"interface {ifname} does not exist on {self.h.name}: fix 'vdev'/'iface' "
                "in the inventory (`ip link` on the host lists the interfaces)"
            )

    def step_nic_bind(self):
        h = self.h
        if h.vdev:
            if h.kernel_iface:
                self._iface_exists(h.kernel_iface)
            return OK, "vdev, nothing to bind"
        if h.iface:
            self._iface_exists(h.iface)
            return OK, f"kernel interface {h.iface}, nothing to bind"
        dev = f"/sys/bus/pci/devices/{h.pci}"
        if self.run(f"test -e {dev}", check=False).exited != 0:
            raise StepFailed(
                f"no PCI device {h.pci} on {h.name}: fix 'pci' (`lspci -D` lists them)"
            )
        cur = self.run(
            f'basename "$(readlink {dev}/driver)" 2>/dev/null', check=False
        ).stdout.strip()
        if cur == h.driver:
            return OK, f"{h.pci} bound to {h.driver}"
        mod = h.driver.replace("-", "_")
        return Change(
            f"would bind {h.pci} from {cur or 'no driver'} to {h.driver}",
            lambda: self.run(
                f"modprobe {mod} && dpdk-devbind.py --force --bind={h.driver} {h.pci}"
            ),
            f"bound {h.pci} to {h.driver} (was {cur or 'unbound'})",
        )

    def step_mtu(self):
        h = self.h
        ifname = h.kernel_iface
        if not ifname:
            return OK, f"PCI NIC: homagg-switch --mtu {h.mtu} sets it"
        q = shlex.quote(ifname)
        cur = self.run(f"cat /sys/class/net/{q}/mtu").stdout.strip()
        if cur == str(h.mtu):
            return OK, f"{ifname} has MTU {h.mtu}"

        def apply():
            r = self.run(f"ip link set dev {q} mtu {h.mtu}", check=False)
            if r.exited != 0:
                raise StepFailed(
                    f"cannot set MTU {h.mtu} on {ifname} of {h.name} (it has {cur}): "
                    "its NIC or driver does not take it; lower 'mtu' in the inventory "
                    "(every host the same) or use a NIC that carries it",
                    _tail(r.stderr),
                )

        return Change(
            f"would set the MTU of {ifname} from {cur} to {h.mtu}",
            apply,
            f"set the MTU of {ifname} from {cur} to {h.mtu}",
        )

    def step_address(self):
        h = self.h
        if not h.iface:
            return (
                OK,
                "the DPDK daemon owns dataplane_ip"
                if h.role == "aggregator"
                else "no kernel interface",
            )
        r = self.run(f"ip -o -4 addr show dev {shlex.quote(h.iface)}")
        if any(h.dataplane_ip in ln.split() for ln in r.stdout.splitlines()):
            return OK, f"{h.dataplane_ip} on {h.iface}"
        return Change(
            f"would add {h.dataplane_ip} to {h.iface}",
            lambda: self.run(
                f"ip addr add {h.dataplane_ip} dev {shlex.quote(h.iface)} && "
                f"ip link set dev {shlex.quote(h.iface)} up"
            ),
            f"added {h.dataplane_ip} to {h.iface}",
        )

    def step_config(self):
        text = host_config(self.h, self.inv, self.srcdir)
        path = self.h.config_file
        r = self.run(f"cat {shlex.quote(path)} 2>/dev/null", check=False)
        if r.exited == 0 and r.stdout == text:
            return OK, f"{path} up to date"
        return Change(f"would write {path}", lambda: self.put_text(text, path), f"wrote {path}")

    def step_secret(self):
        h = self.h
        if not self.inv.settings.auth_secret:
            return OK, "no auth_secret in the inventory"
        if h.role != "worker":
            return OK, "an aggregator gets the secret over its control socket"
        if self.secret is None:  # a dry run and no file yet
            return (
                WOULD,
                f"would create {self.inv.settings.auth_secret} and copy it to {h.secret_file}",
            )
        state = hsecret.host_state(self, h.secret_file, self.secret)
        if state == "ok":
            return OK, f"{h.secret_file} (mode 0600) holds the job secret"
        return Change(
            f"would copy the job secret to {h.secret_file} ({state})",
            lambda: hsecret.put(self, h.secret_file, self.secret),
            f"copied the job secret to {h.secret_file} (mode 0600; {state} before)",
        )

    def provision(self, view=None) -> list[StepResult]:
        """Every step in order (a failed step skips the rest); ``view`` (a
        homagg.deploy.remote.progress.StepView) hears each step's start and end."""
        out = []
        failed = False
        for step in STEPS:
            if failed:
                res = StepResult(step, SKIPPED, "an earlier step failed")
            else:
                if view is not None:
                    view.start(self.h.name, step)
                try:
                    status, detail = self.run_step(step)
                    res = StepResult(step, status, detail)
                except StepFailed as e:
                    res = StepResult(step, FAILED, e.detail, e.stderr)
                    failed = True
                except Exception as e:  # SSH dropped, timeout: report, do not hide other hosts
                    res = StepResult(step, FAILED, f"{type(e).__name__}: {e}")
                    failed = True
            out.append(res)
            if view is not None:
                view.done(self.h.name, res)
        return out


# --------------------------------------------------------------------------
# All hosts


def provision(
    inventory: inv.Inventory,
    hosts: list[str] | None = None,
    dry_run: bool = False,
    artifact: str | None = None,
    out=None,
    wheelhouse: str | None = None,
    live: bool | None = None,
) -> dict[str, list[StepResult]]:
    """Provision the selected hosts; returns host -> [StepResult].  While the
    steps run, a live per-host view (homagg.deploy.remote.progress.StepView; ``live``
    None: when stderr is a terminal, else one log line per step).  Raises
    PreflightError (nothing changed) or ProvisionError (after every host
    finished), each carrying all failing hosts."""
    out = out or sys.stdout
    selected = inventory.select(hosts)
    artifact = artifact or inventory.settings.project
    if not artifact:
        artifact = build_sdist(tempfile.mkdtemp(prefix="homagg-sdist-"))
    digest = artifact_digest(artifact)
    if not inventory.settings.pip_index:
        wheelhouse = (
            wheelhouse
            or inventory.settings.wheelhouse
            or build_wheelhouse(os.path.join(tempfile.gettempdir(), "homagg-wheelhouse"))
        )
    else:
        wheelhouse = None
    runs = [HostRun(h, inventory, artifact, digest, dry_run, wheelhouse) for h in selected]
    if inventory.settings.auth_secret and not (
        dry_run and not os.path.exists(inventory.settings.auth_secret)
    ):
        secret = hsecret.local_secret(inventory)  # created when missing; refused if not 0600
        for r in runs:
            r.secret = secret
    try:
        preflight_all(runs, inventory.settings.parallel, out, "nothing was changed")
        title = "homagg provision" + (" (dry run)" if dry_run else "")
        with StepView([r.h.name for r in runs], STEPS, title, live=live) as view:
            reports = parallel(lambda r: r.provision(view), runs, inventory.settings.parallel)
    finally:
        for r in runs:
            r.close()
    print(format_table(reports), file=out)
    failures = [
        (n, s.step, s.detail, s.stderr)
        for n, steps in reports.items()
        for s in steps
        if s.status == FAILED
    ]
    if failures:
        raise ProvisionError(failure_message("provisioning failed", failures), failures, reports)
    return reports


# --------------------------------------------------------------------------
# CLI


def add_arguments(p):
    p.add_argument("-i", "--inventory", required=True, help="testbed.toml (docs/INVENTORY.md)")
    p.add_argument(
        "--dry-run", action="store_true", help="check every host and print what would be done"
    )
    p.add_argument("--hosts", help="comma-separated host names (default: all)")
    p.add_argument(
        "--artifact",
        help="sdist/wheel to install (default: settings.project, "
        "else an sdist built from this checkout)",
    )


def main(args) -> int:
    try:
        inventory = inv.load(args.inventory)
        names = [n.strip() for n in args.hosts.split(",") if n.strip()] if args.hosts else None
        provision(inventory, names, dry_run=args.dry_run, artifact=args.artifact)
    except HomAggError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
