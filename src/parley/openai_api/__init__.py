"""OpenAI's interfaces as parley serves them, without HTTP: the Responses API's requests
and objects, chat completions' requests, messages and objects (a batch's lines may be
either), the Batch API's lines and objects, and OpenAI's error form.  The gateway's
routers (``src/parley/gateway/routers``) answer them over HTTP; ``parley.batches`` uses the
same for batches submitted from Python."""
