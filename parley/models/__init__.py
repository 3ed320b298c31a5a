"""Models a host can run: the offline scripted model and function-backed models.

Any object with a ``name`` and ``stream(request, on_delta) -> ModelReply`` is a model."""

from parley.models.function import FunctionModel
from parley.models.scripted import ScriptedModel
from workers.ports import ModelReply, ModelRequest, StreamAborted

__all__ = ["FunctionModel", "ModelReply", "ModelRequest", "ScriptedModel", "StreamAborted"]
