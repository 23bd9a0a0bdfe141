"""Where the worker processes' CPU goes during the timed allreduces of a
``perf record -a -g -e cpu-clock`` profile (profile.sh).

    perf script -i perf.data -F comm,time,ip,sym,dso > samples.txt
    python classify.py samples.txt REPEAT WORKERS HZ

The timed window is from the first to the last sample whose call chain is
in the client's receive loop (hg_cl_rx_all): the workers generate their
gradients before it and save their results after it.  Each worker sample
in the window is put in one class by its call chain (the first match of
CLASSES, else "user: <leaf symbol>"); within the send system calls, the
samples in the kernel's softirq processing (the testbed's veth, bridge,
tbf and the aggregator's XDP socket, run on the sender's CPU) are counted
apart.  Output: per class, its share and milliseconds per allreduce per
worker (samples / HZ / REPEAT / WORKERS).
"""

import collections
import re
import sys

HEADER = re.compile(r"\s*(\S.*?)\s+(\d+\.\d+):\s*$")
CLASSES = [
    ("asm_exc_page_fault", "page faults"),
    ("sendmmsg", "send (sendmmsg)"),
    ("sendmsg", "send (sendmsg)"),
    ("recvmmsg", "receive (recvmmsg)"),
    ("recvmsg", "receive (recvmsg)"),
    ("do_sys_poll", "poll"),
    ("ep_poll", "poll"),
    ("asm_sysvec", "interrupts"),
    ("entry_SYSCALL", "other system calls"),
]


def load(path, comm):
    samples, cur = [], None
    for line in open(path):
        if not line.strip():
            cur = None
            continue
        m = HEADER.match(line)
        if m:
            cur = [m.group(1), float(m.group(2)), []]
            samples.append(cur)
        elif cur is not None:
            parts = line.split()
            cur[2].append(parts[1].split("+")[0] if len(parts) > 1 else "")
    return [s for s in samples if s[0] == comm]


def classify(frames):
    for key, label in CLASSES:
        if any(key in f for f in frames):
            return label
    return "user: " + frames[0]


def main():
    path, repeat, workers, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    samples = load(path, "python")
    loop = [s[1] for s in samples if any("hg_cl_rx_all" in f for f in s[2])]
    if not loop:
        sys.exit("no sample in hg_cl_rx_all: not a profile of homagg run allreduce")
    t0, t1 = min(loop), max(loop)
    window = [s for s in samples if t0 <= s[1] <= t1]
    per = 1e3 / hz / repeat / workers
    print(
        f"timed window {t1 - t0:.2f} s, {len(window)} worker samples, "
        f"{len(window) * per:.1f} ms of CPU per allreduce per worker"
    )
    counts = collections.Counter(classify(s[2]) for s in window)
    for label, n in counts.most_common(25):
        print(f"{100 * n / len(window):5.1f} %  {n * per:6.2f} ms  {label}")
    send = [s for s in window if classify(s[2]).startswith("send")]
    soft = [s for s in send if any("handle_softirqs" in f for f in s[2])]
    if send:
        print(
            f"of the sends: {len(soft) * per:.2f} ms per allreduce per worker in softirq "
            f"processing (the testbed's links, bridge and the aggregator's receive), "
            f"{(len(send) - len(soft)) * per:.2f} ms the send itself"
        )


if __name__ == "__main__":
    main()
