"""The rollout server (`cohort serve`): an engine behind HTTP (app.py), its request bodies checked field by field
(bodies.py), the requests in flight driven by one thread (request_stream.py). Its client is
cohort/rollout/server/client.py."""
