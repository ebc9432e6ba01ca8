"""The process layout of `edgeserve serve --workers N`: N front processes and one inference
process per device, so that one function uses the whole machine.

    supervisor ─┬─ front 0 ─┐  uvicorn on the connections the supervisor hands it (fewest
                │           │  first), decoding, handler pre/postprocess
                ├─ front 1 ─┼─ unix sockets (control) + the front's arena (tensors, written once)
                ├─ ...      │
                ├─ inference process 0 (cuda:0) ─┐  the backend and a batcher each; every
                └─ inference process 1 (cuda:1) ─┘  front feeds every one, shortest queue first

`layout` decides how many fronts (`auto` from cores and devices) and which inference processes
(one per visible GPU, or the CPU; [resources] devices, processes_per_device); `supervisor` runs
them and `handoff` gives each connection to a front; `front` (its `link` to each inference
process) and `inference` are the two kinds of child, `child` what each is told; `arena`, `wire`
and `board` (with `statistics`) are what they share.
"""

from edgeserve.workers.layout import Layout, choose_layout, usable_cores, workers_setting
from edgeserve.workers.supervisor import serve_workers

__all__ = ["Layout", "choose_layout", "serve_workers", "usable_cores", "workers_setting"]
