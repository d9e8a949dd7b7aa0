"""Serve one model over HTTP: OpenAI's chat and completions API, and a chat page.

    python serve.py --out_dir out-chat                  # then open http://127.0.0.1:8000/
    python serve.py --init_from gpt2 --port 8080        # GPT-2: /v1/completions (it is not a chat model)
    GPTKIT_API_KEY=secret python serve.py --out_dir out-chat --host 0.0.0.0   # reachable by others: with a key
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "What is 2+3?"}], "temperature": 0}'

Which model: as sample.py (`--out_dir`'s best.pt or ckpt.pt, `--ckpt FILE`, a LoRA
run's folder, `--init_from gpt2` or a Hugging Face folder). A chat-trained model
answers /v1/chat/completions with the template of gptkit/data/chat.py and exactly
sample.py --chat's code (its replies at temperature 0 are the same); any model
answers /v1/completions. One worker generates every request in one continuous
batch: a request joins the running ones at the next token and leaves when done
(up to --max_batch replies at once, model.py's forward with its BatchKVCache); up to
--queue_size requests are taken at once, one more is answered 503 at once. Binds 127.0.0.1 unless --host says otherwise; with an API key (--api_key
or $GPTKIT_API_KEY) every endpoint but /health and the page needs
`Authorization: Bearer KEY`. Bodies must be JSON and the Host header the server's
own (--require_json, --allowed_hosts: no web page elsewhere can drive it); a request
must arrive whole within --request_timeout seconds. SIGINT or SIGTERM cut open
streams and exit 0.
docs/serve.md: the page, Open WebUI and other clients, the limits and errors.
"""

from dataclasses import dataclass
from pathlib import Path

from gptkit.ops.errors import quiet_start

quiet_start()  # a Ctrl-C or a missing package while the imports below load: one line, no traceback
from gptkit.config import parse_settings, setting
from gptkit.ops.device import SAMPLE_DTYPES, resolve_device
from gptkit.ops.errors import run_main
from gptkit.models.loading import load_model
from gptkit.serve.guard import parse_allowed_hosts

MAX_QUEUE = 4096


@dataclass
class ServeConfig:
    """Serving"""

    init_from: str = setting(
        "resume",
        "resume (a checkpoint in out_dir or --ckpt), gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a Hugging Face folder",
    )
    out_dir: str = setting("out-shakespeare", "folder holding best.pt / ckpt.pt (train.py's out_dir)")
    ckpt: str | None = setting(None, "a checkpoint file to load instead of looking in out_dir")
    data_dir: str = setting("data", "where to look for a nanoGPT checkpoint's <dataset>/meta.pkl")
    meta: str | None = setting(None, "a nanoGPT meta.pkl to take the character vocabulary from")
    host: str = setting("127.0.0.1", "the address to listen on: 127.0.0.1 is this machine only; 0.0.0.0 every "
                        "network (set an API key then)")
    port: int = setting(8000, "the port to listen on (0: a free one, printed)")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on every endpoint but /health and the "
                                  "page (better: the environment variable GPTKIT_API_KEY, which ps does not show)")
    model_name: str | None = setting(None, "the model's id in /v1/models and requests (default: the out_dir's, "
                                     "checkpoint's or init_from's name)")
    queue_size: int = setting(32, "requests taken at once, the one generating and those waiting; one more is "
                              "answered 503 at once")
    max_tokens: int | None = setting(None, "the most tokens one reply may have (default: the model's block_size); "
                                     "a request asking for more gets this many")
    max_body_bytes: int = setting(1_000_000, "the largest request body taken (larger: 413)")
    allowed_hosts: str = setting("", "more names (comma-separated) the Host header may give besides localhost, "
                                 "127.0.0.1, ::1, the --host and this machine's name; '*': any (behind a proxy "
                                 "that checks it)")
    require_json: bool = setting(True, "refuse a POST body not sent as Content-Type: application/json (415), "
                                 "which is what keeps web pages on other sites from sending requests")
    request_timeout: float = setting(10.0, "seconds a client has to send a whole request, from connecting or its "
                                     "last reply; a slower or silent connection is closed")
    device: str = setting("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:1, mps")
    dtype: str = setting("auto", "weights' dtype: auto (bfloat16 on CUDA when supported, else float32), float32, "
                         "bfloat16, float16, int8 (as sample.py)")
    cpu_decode: bool = setting(True, "on a CPU, faster products swapped into model.py's Linears "
                               "(gptkit/fast/cpu_linears.py, as sample.py); false: nn.Linear as written")
    max_batch: int = setting(16, "the most replies generated together, one token each per step (a request "
                             "with n choices takes n); more wait in the queue")
    tools: str = setting("calculator", "a chat model trained on tool calls: what its calls run, calculator (its "
                         "output forced into the reply) or none (the model writes on alone)")
    stream_interval: float = setting(0.02, "the least seconds between two writes to a streaming client: the "
                                     "tokens made meanwhile go out in one write (the first token and the "
                                     "reply's end at once), less server CPU per token at many streams; 0: "
                                     "every step's text at once")

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} must be between 0 and 65535")
        if not 1 <= self.queue_size <= MAX_QUEUE:
            raise ValueError(f"queue_size={self.queue_size} must be between 1 and {MAX_QUEUE}")
        if not 1 <= self.max_batch <= MAX_QUEUE:
            raise ValueError(f"max_batch={self.max_batch} must be between 1 and {MAX_QUEUE}")
        if not 0 <= self.stream_interval <= 1:
            raise ValueError(f"stream_interval={self.stream_interval} must be between 0 and 1 second")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} must be 1 or more")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes={self.max_body_bytes} must be at least 1024")
        if self.dtype not in ("auto", *SAMPLE_DTYPES):
            raise ValueError(f"dtype={self.dtype!r} must be one of auto, {', '.join(SAMPLE_DTYPES)}")
        if not 0 < self.request_timeout <= 3600:
            raise ValueError(f"request_timeout={self.request_timeout} must be above 0 and at most 3600 seconds")
        parse_allowed_hosts(self.allowed_hosts)
        if self.model_name == "":
            raise ValueError("model_name must not be empty")
        if self.tools not in ("calculator", "none"):
            raise ValueError(f"tools={self.tools!r} must be calculator or none")


def model_name(cfg):
    """The id clients name the model by: what the user named on the command line."""
    if cfg.model_name:
        return cfg.model_name
    if cfg.init_from != "resume":
        return Path(cfg.init_from).name or cfg.init_from
    if cfg.ckpt:
        return Path(cfg.ckpt).stem
    return Path(cfg.out_dir).resolve().name


def main(argv=None):
    from gptkit.serve.server import api_key, bind, serve

    (cfg,) = parse_settings(argv, [ServeConfig], prog="serve.py", description=__doc__)
    api_key(cfg)  # a key no client could send is refused before anything loads
    # The web packages: one that is missing is named now, not after the model has loaded.
    import starlette, uvicorn  # noqa: F401
    device = resolve_device(cfg.device)
    sock = bind(cfg.host, cfg.port)  # before the model loads: a port in use fails at once
    model, tokenizer, summary = load_model(cfg.init_from, cfg.out_dir, cfg.ckpt, cfg.data_dir, cfg.meta)
    return serve(model, tokenizer, summary, cfg, device, model_name(cfg), sock)


if __name__ == "__main__":
    run_main(main)
