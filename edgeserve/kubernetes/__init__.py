"""Kubernetes targets: Knative Service, KServe InferenceService, Deployment + Service + HPA.

One image per function (edgeserve.image), so each function scales on its own traffic.
`settings.py` is the profile schema, `scaling.py` derives per-pod concurrency from the
batching settings, `manifests.py` renders (pure), `driver.py` packages and deploys,
`cluster.py` talks to the API server, `rollouts.py` moves traffic per kind.
"""
