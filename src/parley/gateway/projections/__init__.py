"""The protocol views of a turn, each a :class:`~parley.gateway.projection.Projection` of
its parley events into a protocol's own, on one base that walks the events and hands
each to a hook per kind (``base.TurnProjection``): AG-UI's run (``agui``), the AI SDK's
UI message stream (``aisdk``), OpenAI Responses' streaming events (``responses``, with
the response objects they carry in ``parley.openai_api.response_objects``)."""
