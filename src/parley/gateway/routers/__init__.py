"""The gateway's routers, one per interface: parley's own (``native``), AG-UI
(``agui``), the AI SDK's UI message stream (``aisdk``), OpenAI Responses
(``responses``), its Files and Batches (``files``, ``batches``), health, readiness and
metrics (``operations``) and the web page
(``page``).  ``create_app`` includes each; their dependencies are declared from
:mod:`parley.gateway.dependencies` and :mod:`parley.gateway.ownership`.  No router
imports another (an import-linter contract): what they share is a gateway module."""
