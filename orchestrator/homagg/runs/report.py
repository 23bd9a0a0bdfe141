"""The run reports' common behaviour (homagg.runs.allreduce.AllreduceReport,
homagg.train.train.TrainReport): a dataclass, one meaning per field on
every placement, read like the dict it replaced."""

from __future__ import annotations

from dataclasses import fields


class ReportView:
    """A report dataclass that reads like the dict it replaces
    (``rep["seconds"]``, ``rep.get``, ``rep.keys()``); ``as_dict`` gives a
    plain dict (JSON)."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def keys(self):
        return self.as_dict().keys()

    def __getitem__(self, key: str):
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return key in self.__dataclass_fields__

    def get(self, key: str, default=None):
        return getattr(self, key) if key in self.__dataclass_fields__ else default
