"""A ``homagg`` torch.distributed backend: ``dist.all_reduce`` through HomAgg.

    import homagg.torch_backend  # registers the backend "homagg" (cpu)
    torch.distributed.init_process_group(backend="cpu:homagg")
    torch.distributed.all_reduce(t)  # SUM / AVG of float32, float16, bfloat16: HomAgg

Rank and world size come from init_process_group (torchrun's environment or
its arguments), the HomAgg job from the environment as for homagg.torch
(HOMAGG_JOB_FILE, HOMAGG_AGGREGATOR, HOMAGG_JOB, HOMAGG_TOKEN, HOMAGG_BIND,
HOMAGG_TIMEOUT, ...); HOMAGG_METHOD picks the method (default "auto").

What goes through HomAgg: ``allreduce`` (and ``allreduce_coalesced``) of
contiguous CPU tensors of float32, float16 or bfloat16 with ReduceOp SUM or
AVG.  The result is the exact fixed-point sum (docs/PROTOCOL.md) computed
in float32, divided by the world size for AVG, cast back to the tensor's
dtype: bit-identical on every rank.  Several tensors of one call are
reduced one after the other, in order.

What is delegated to a Gloo backend made on the same store: every other
collective (broadcast, barrier, all_gather, gather, scatter, reduce,
reduce_scatter, all_to_all, send / recv, the *_object helpers) and
allreduce of any other dtype (int64 counters, float64) or op (MIN, MAX,
PRODUCT, ...).  The Gloo backend is created when the process group is, so
a job that only broadcasts never touches the aggregator; the HomAgg worker
is made at the first allreduce it carries (a missing aggregator is then a
ConfigError naming the variable to set).  Errors of a HomAgg allreduce
(PeerTimeout naming the aggregator, ...) are raised by the work's wait().
Each process group of this backend has its own HomAgg worker: give a group
other than the default one its own job (HOMAGG_* variables of the process)
only if it spans every worker of that job.  Its worker does not
authenticate (the job file's ``auth_file`` is not read), so it cannot join
a job of ``--auth`` and follows no key rotation (``homagg rotate-key``;
homagg.torch's HookState does).

Why every delegated collective is a Python method here: torch calls a
collective that a Python subclass of ProcessGroup does not override with
the GIL held (its trampoline takes the GIL to look for an override, and
keeps it for the base class's call).  Gloo's enqueue then waits for the
queue's lock, which a Gloo thread may hold while it frees a finished
work's tensors, and freeing a tensor that Python knows needs the GIL: both
wait for ever.  The methods below call Gloo's Python bindings, which
release the GIL first.
"""

import os

import numpy as np
import torch
import torch.distributed as dist

from homagg import protocol
from homagg.switch.job_file import ConfigError

NAME = "homagg"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _work(fut):
    from torch._C._distributed_c10d import _create_work_from_future

    return _create_work_from_future(fut)


class HomAggProcessGroup(dist.ProcessGroup):
    """The process group ``init_process_group(backend="cpu:homagg")`` makes."""

    def __init__(self, store, rank, world_size, timeout, env=None):
        super().__init__(rank, world_size)
        self._gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        # what this class does not override goes to Gloo
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self._env = env
        self._worker = None
        self.method = (env if env is not None else os.environ).get("HOMAGG_METHOD", "auto")
        protocol.method(self.method)  # InvalidArgument naming the choices
        self.counters = {"homagg_allreduce": 0, "delegated_allreduce": 0}

    def getBackendName(self):
        return NAME

    @property
    def worker(self):
        if self._worker is None:
            from homagg.switch.job_file import job_config
            from homagg.worker import Worker

            conf = job_config(self._env)
            rank, world = self.rank(), self.size()
            if conf["workers"] and conf["workers"] != world:
                raise ConfigError(
                    f"the HomAgg job {conf['job']} has {conf['workers']} workers "
                    f"(HOMAGG_WORKERS or the job file), the world size is "
                    f"{world}: start as many ranks as the job has workers"
                )
            self._worker = Worker(
                job=conf["job"],
                token=conf["token"],
                worker=rank,
                workers=world,
                aggregators=conf["aggregators"],
                group=conf["group"] or None,
                bind=(conf["bind"], 0),
                timeout=conf["timeout"],
                slots=conf["slots"],
                payload=conf["payload"],
                leaf_ids=conf["leaf_ids"],
                udp_gso=conf["udp_gso"],
            )
        return self._worker

    @staticmethod
    def _op(opts):
        """The RedOpType of an AllreduceOptions (its reduceOp is a ReduceOp
        wrapping one; `in` on a tuple of RedOpTypes would not match it)."""
        op = opts.reduceOp
        return getattr(op, "op", op)

    def _ours(self, tensors, op):
        return op in (dist.ReduceOp.RedOpType.SUM, dist.ReduceOp.RedOpType.AVG) and all(
            t.device.type == "cpu" and t.dtype in DTYPES and t.is_contiguous() for t in tensors
        )

    def allreduce(self, tensors, opts=None):
        if opts is None:
            opts = dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = self._op(opts)
        if not self._ours(tensors, op):
            self.counters["delegated_allreduce"] += 1
            return self._gloo.allreduce(tensors, opts)
        avg = op == dist.ReduceOp.RedOpType.AVG
        fut = torch.futures.Future()
        try:
            worker = self.worker
        except Exception as exc:  # noqa: BLE001 - the caller's wait() raises it
            fut.set_exception(exc)
            return _work(fut)
        self.counters["homagg_allreduce"] += 1
        world = np.float32(self.size())
        xs = [t.detach().reshape(-1).to(torch.float32).numpy() for t in tensors]
        if any(t.dtype == torch.float32 for t in tensors):
            xs = [x.copy() if t.dtype == torch.float32 else x for x, t in zip(xs, tensors)]
        pending = [worker.allreduce_async(x, self.method) for x in xs]

        def finish(_):  # the worker runs its calls in order: the last one done, all are
            try:
                for t, p in zip(tensors, pending):
                    y = p.result()
                    if avg:
                        np.divide(y, world, out=y)
                    with torch.no_grad():
                        t.copy_(torch.from_numpy(y).reshape(t.shape).to(t.dtype))
                fut.set_result(tensors)
            except BaseException as exc:  # noqa: BLE001 - raised by wait()
                fut.set_exception(exc)

        pending[-1].add_done_callback(finish)
        return _work(fut)

    def allreduce_coalesced(self, tensors, opts=None):
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self.allreduce(list(tensors), o)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """One Gloo ``_allgather_base`` per pair (Gloo has no binding for
        the coalesced form), done when all are."""
        return self._each("_allgather_base", outputs, inputs, opts or dist.AllgatherOptions())

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """One Gloo ``_reduce_scatter_base`` per pair, done when all are."""
        return self._each(
            "_reduce_scatter_base", outputs, inputs, opts or dist.ReduceScatterOptions()
        )

    def _each(self, name, outputs, inputs, opts):
        call = getattr(self._gloo, name)
        works = [call(o, i, opts) for o, i in zip(outputs, inputs)]
        fut = torch.futures.collect_all([w.get_future() for w in works])
        return _work(fut.then(lambda _: list(outputs)))

    def close(self):
        if self._worker is not None:
            self._worker.close()
            self._worker = None


# Collectives HomAgg does not carry: Gloo's, through its bindings (they
# release the GIL; see the module doc).
DELEGATED = (
    "allgather",
    "allgather_coalesced",
    "_allgather_base",
    "alltoall",
    "alltoall_base",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "gather",
    "scatter",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "send",
    "recv",
    "recv_anysource",
)


def _delegate(name):
    def collective(self, *args, **kwargs):
        return getattr(self._gloo, name)(*args, **kwargs)

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"Gloo's ``{name}``, called with the GIL released."
    return collective


for _name in DELEGATED:
    setattr(HomAggProcessGroup, _name, _delegate(_name))


def _create(store, rank, world_size, timeout):
    return HomAggProcessGroup(store, rank, world_size, timeout)


def register():
    """Register the backend "homagg" (cpu) with torch.distributed (idempotent;
    importing this module does it)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])


register()
