"""serve.py: one model over HTTP, in the OpenAI protocol, with a chat page.

    python serve.py --out_dir out-chat                 # http://127.0.0.1:8000: the page; /v1: the API
    GPTKIT_API_KEY=secret python serve.py --out_dir out-chat --host 0.0.0.0

The parts: `api.py` (requests checked, errors and replies in OpenAI's shapes),
`worker.py` (the one thread that owns the model: the queue, places and cancelling),
`batch.py` (continuous batching: every request's rows advance one token a step), `app.py` (the Starlette routes and the uvicorn server),
`page.html` (the chat page, plain HTML and JavaScript), `server.py` (the set-up
serve.py calls: socket, key, worker, app). docs/serve.md is the manual.
"""
