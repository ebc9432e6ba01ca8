"""OCI images of functions: one image per function, for Kubernetes targets and AWS Lambda.

`plan.py` decides what goes where (pure: a Containerfile and a file layout as data);
`tools.py` finds buildah, podman or docker and says why; `builder.py` stages the context
(wheels for the image's Python and architecture), builds, measures the layers and pushes.
"""

from edgeserve.image.builder import BuiltImage, build_image, push_image
from edgeserve.image.plan import ImagePlan, plan_image
from edgeserve.image.tools import ImageTool, find_tool

__all__ = [
    "BuiltImage",
    "ImagePlan",
    "ImageTool",
    "build_image",
    "find_tool",
    "plan_image",
    "push_image",
]
