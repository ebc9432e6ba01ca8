"""What a loaded model is warmed up with before the server says ready, and what a failed
warm-up means.

Every batch size the batcher will run (and every backend bucket) runs once at start, so that no
request pays for a first run. Its inputs are the function's own samples where one holds the
model's inputs (values its author knows the model takes; its rows repeated to each size), else
made-up ones (`samples.plain_array`: zeros, ones for integers). A sample is held to the door
every request meets (dataplane/checks.py): one it refuses (ids past an embedding table, which
ONNX Runtime fails on and OpenVINO answers with zeros; a shape the backend was not loaded for)
is skipped with a warning saying why, as a request holding it would be refused.

A model may still fail on them: a Reshape to a shape an input gives, a TopK of an input's k
past its axis. Such a failure of the values (ModelRefused, a 422 for a request) is no reason to
refuse a model that answers its real requests: it is logged, naming the inputs and what they
held, and the server goes on; a request with such values is told what the model said. Any other
failure (memory, the GPU, a backend's fault: BackendError) means the model cannot run at all,
and the start fails as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeserve.dataplane import InputChecks
from edgeserve.errors import InvalidInput, ModelRefused
from edgeserve.samples import example_inputs, plain_values
from edgeserve.shapes import ShapeProfile
from edgeserve.types import Signature, TensorDict

log = logging.getLogger("edgeserve")

Sample = tuple[str, TensorDict]
"""A sample's name (samples/k.json) and the model inputs it holds (samples.json_samples)."""


@dataclass(frozen=True)
class WarmupBatch:
    """One warm-up run: `rows` rows of `inputs`, which `given` describes (a sample's name, or
    the made-up values of each input)."""

    rows: int
    inputs: TensorDict
    given: str


def warmup_batches(
    signature: Signature,
    sizes: Sequence[int],
    samples: Sequence[Sample],
    profile: ShapeProfile | None,
    backend: str,
) -> list[WarmupBatch]:
    """A batch per size, from the first sample the door of a model on `backend` (its name)
    lets in, else made up."""
    door = InputChecks.for_backend(signature, profile, signature.batched, backend)
    sample = next((s for s in samples if _admitted(s, signature, door)), None)
    if sample is None:
        given = (
            "made-up values ("
            + ", ".join(f"`{spec.name}` {plain_values(spec)}" for spec in signature.required)
            + ")"
        )
        return [WarmupBatch(n, example_inputs(signature, n), given) for n in sizes]
    name, tensors = sample
    return [WarmupBatch(n, _rows_of(tensors, signature, n), name) for n in sizes]


def _admitted(sample: Sample, signature: Signature, door: InputChecks) -> bool:
    """Whether the door lets in a sample's required inputs, every row the warm-up repeats,
    with rows to repeat; a warning says why not."""
    name, tensors = sample
    shapes = [tensors[spec.name].shape for spec in signature.required]
    if signature.batched and any(not shape or not shape[0] for shape in shapes):
        reason = "an input holds no rows"
    else:
        try:
            door(_required(tensors, signature))
            return True
        except InvalidInput as exc:
            reason = exc.message
    log.warning(
        "warm-up: skipped %s: %s. Hint: the warm-up runs the first sample that passes the "
        "checks every request meets; fix this one or remove it",
        name,
        reason,
    )
    return False


def _rows_of(tensors: TensorDict, signature: Signature, rows: int) -> TensorDict:
    """The sample's required inputs; on a batch axis, its rows repeated to `rows`."""
    picked = _required(tensors, signature)
    if not signature.batched:
        return picked
    return {name: np.take(a, np.arange(rows) % len(a), axis=0) for name, a in picked.items()}


def _required(tensors: TensorDict, signature: Signature) -> TensorDict:
    return {spec.name: tensors[spec.name] for spec in signature.required}


@dataclass
class Warmup:
    """Runs the warm-up batches (on each batcher thread) and keeps what the model failed on."""

    batches: list[WarmupBatch]
    failed: dict[str, tuple[str, set[int]]] = field(default_factory=dict)
    """What the model failed on (a WarmupBatch's `given`): its first words, and the sizes."""

    def run(self, infer: Callable[[TensorDict], TensorDict]) -> None:
        for batch in self.batches:
            try:
                infer(batch.inputs)
            except ModelRefused as exc:  # the values: said once started (`report`)
                self.failed.setdefault(batch.given, (exc.message, set()))[1].add(batch.rows)

    def report(self, batched: bool) -> None:
        """A warning per failure: on what, the model's words, and what to do."""
        for given, (message, rows) in self.failed.items():
            sizes = f" (batches of {', '.join(map(str, sorted(rows)))} rows)" if batched else ""
            hint = (
                f"check {given}: the warm-up runs the first sample that holds the model's inputs"
                if given.startswith("samples/")
                else "put a v2 infer request with values the model takes in samples/ (a "
                "samples/*.json): the warm-up then runs it"
            )
            log.warning(
                "warm-up: the model failed on %s%s: %s. Serving anyway: a request with values "
                "the model cannot take gets a 422 with its words. Hint: %s",
                given,
                sizes,
                message,
                hint,
            )
