"""What the fleet shares outside the database: session locks and fencing, replay buffers
and live deltas, steer lists and work marks, in Redis (its Lua scripts in ``lua/``) and in
process for the embedded client, behind one port; the admission of model calls to each
model's provider limits (its arithmetic in ``admission_math``), in Redis and in process,
behind another; every key shape and timing."""
