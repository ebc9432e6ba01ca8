"""The process layout of `edgeserve serve --workers N`: N front processes and one inference
process, so that one function uses the whole machine.

    supervisor ─┬─ front 0 ─┐  uvicorn on the shared socket, decoding, handler pre/postprocess
                ├─ front 1 ─┼─ unix socket (control) + the front's arena (tensors, written once)
                ├─ ...      │
                └─ inference process: the backend and the one batcher every front's items meet in

`layout` decides how many fronts (`auto` from cores and devices); `supervisor` runs them;
`front` and `inference` are the two kinds of child; `arena`, `wire` and `board` are what they
share (tensors, control messages, counters).
"""

from edgeserve.workers.layout import Layout, choose_layout, usable_cores, workers_setting
from edgeserve.workers.supervisor import serve_workers

__all__ = ["Layout", "choose_layout", "serve_workers", "usable_cores", "workers_setting"]
