"""Tensor dumps in the layout `shardcheck run --dump-tensors` writes and `shardcheck compare` reads
(DESIGN.md "Tensor dumps"): one NumPy .npy per tensor, named after the tensor with '/' replaced by
"__", and index.json, a list of {name, file, shape, dtype} in the order written.

    d = Dump("out/run")                      # refuses a directory that holds a dump already
    d.step(1, loss=2.31, grad_norm=0.8, params=full_params)
    d.close()                                # writes index.json

Names: step<N>/loss, step<N>/grad_norm (before clipping), step<N>/clip_factor, step<N>/lr,
step<N>/param/<p> (after the update), step<N>/grad/<p> (before clipping), init/param/<p>.
Accepts NumPy arrays, CPU torch tensors (float64/float32/float16/int32/int64; bfloat16 is widened
to float32, which holds it exactly) and Python numbers (written as float64 scalars)."""

import json
import os

import numpy as np

_KEEP = {np.dtype("float64"), np.dtype("float32"), np.dtype("float16"), np.dtype("int32"),
         np.dtype("int64")}


def file_name(name):
    return name.replace("/", "__") + ".npy"


def _array(value):
    if hasattr(value, "detach"):  # torch
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        value = t.numpy()
    a = np.asarray(value, dtype=np.float64 if isinstance(value, (int, float)) else None)
    a = a.copy(order="C")  # a scalar stays shape () as the C++ dump writes it
    if a.dtype not in _KEEP:
        raise TypeError(f"a dump holds float64, float32, float16, int32 or int64, not {a.dtype}")
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


class Dump:
    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)
        if os.path.exists(os.path.join(path, "index.json")):
            raise FileExistsError(f"{path} holds a dump already (index.json); choose another")
        self._entries = []
        self._names = set()

    def add(self, name, value):
        if name in self._names:
            raise ValueError(f"tensor {name} is in the dump already")
        a = _array(value)
        np.save(os.path.join(self.path, file_name(name)), a, allow_pickle=False)
        self._entries.append({"name": name, "file": file_name(name), "shape": list(a.shape),
                              "dtype": str(a.dtype)})
        self._names.add(name)

    def step(self, step, *, loss=None, grad_norm=None, clip_factor=None, lr=None, params=None,
             grads=None):
        """The tensors of training step `step` (1-based); params and grads are {name: tensor}."""
        for key, value in (("loss", loss), ("grad_norm", grad_norm),
                           ("clip_factor", clip_factor), ("lr", lr)):
            if value is not None:
                self.add(f"step{step}/{key}", float(value))
        for kind, tensors in (("param", params), ("grad", grads)):
            for name, value in (tensors or {}).items():
                self.add(f"step{step}/{kind}/{name}", value)

    def close(self):
        tmp = os.path.join(self.path, "index.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self._entries, f, indent=1)
        os.replace(tmp, os.path.join(self.path, "index.json"))


def write_record(path, record):
    """A record of the examples' form ({"loss": [...], "grad_norm": [...], "params": {...}} with
    the parameters after the last step) as a dump."""
    d = Dump(path)
    steps = len(record["loss"])
    for i in range(steps):
        d.step(i + 1, loss=record["loss"][i], grad_norm=record["grad_norm"][i],
               params=record["params"] if i == steps - 1 else None)
    d.close()
