"""The gateway's routers, one per interface: parley's own (``native``), AG-UI
(``agui``), the AI SDK's UI message stream (``aisdk``) and OpenAI Responses
(``responses``).  ``create_app`` includes each; their dependencies are declared from
:mod:`parley.gateway.dependencies`."""
