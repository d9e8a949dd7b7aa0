"""serve.py's requests and replies in the OpenAI protocol: checking a request's JSON,
its errors in OpenAI's shape, and the reply and chunk objects.

Every mistake is an `ApiError`, answered as OpenAI answers one:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

What we do beyond or short of OpenAI, said once here (docs/serve.md says it for users):
- max_tokens above the server's cap (default the model's block_size) is capped, not
  refused; absent, it is the cap (/v1/completions: 16, as OpenAI). The reply's
  "gptkit" object gives the max_tokens used and how many of the oldest messages
  were dropped to fit the context (as sample.py --chat drops them).
- `stop` is a string or a list of up to 4; `n` choices (up to MAX_N) are n rows of the batch,
  choice i sampled with seed + i (so each equals a request with that seed alone);
  `logprobs` are the model's own log_softmax, before temperature and filters.
- Fields that would change the reply's meaning and that we cannot honour (tools,
  response_format other than text, ...) are refused naming the field (UNSUPPORTED).
- top_k, min_p and repetition_penalty are taken as extensions (llama.cpp's servers take them).
- Fields we do not know are ignored (clients send many); a known field of the wrong type is an error.
- Every number's kind and range is in NUMBERS (one table); an integer of over MAX_DIGITS
  digits is not even parsed (read_json); a temperature below sampling.py's MIN_TEMPERATURE is greedy.
"""

import dataclasses
import json
import secrets
import time

from gptkit.generation.sampling import MIN_TEMPERATURE, PENALTY_RANGE

ROLES = ("system", "developer", "user", "assistant")
SAME_ROLE = {"developer": "system"}  # OpenAI's newer name for the system message, taken as one
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    def __init__(self, status, message, type="invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self):
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message, type="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error", 503: "server_error", 500: "server_error"}


@dataclasses.dataclass(frozen=True)
class Sampling:
    """What generate.generate_samples reads of a request (sample.py's SampleConfig's fields)."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float
    stop: tuple | None  # stop strings: the reply ends before the first one found
    seed: int
    compile: bool
    cpu_decode: bool
    dtype: str
    num_samples: int = 1
    use_cache: bool = True
    shift_context: bool = True


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def field(body, name, check, what, default=None):
    """body[name] when present and not null, checked by `check`; else `default`."""
    value = body.get(name)
    if value is None:
        return default
    if not check(value):
        raise ApiError(400, f"{name} must be {what}, not {value!r}"[:300], param=name)
    return value


# --- Every number a request may carry: its kind and range, checked here and only here ----
# A value outside its range (NaN, Infinity and 1e999 included) is a 400 naming the field;
# what passes is safe to hand to float() and to sampling.py's float32 arithmetic.
PENALTY_LOW, PENALTY_HIGH = PENALTY_RANGE
NUMBERS = {  # name: (integer only?, in range?, the range in words)
    "temperature": (False, lambda v: 0 <= v <= 2, "between 0 and 2 (0 and below "
                    f"{MIN_TEMPERATURE:g}: greedy)"),  # OpenAI's range
    "top_p": (False, lambda v: 0 < v <= 1, "above 0 and at most 1"),
    "min_p": (False, lambda v: 0 <= v <= 1, "between 0 and 1"),
    "repetition_penalty": (False, lambda v: PENALTY_LOW <= v <= PENALTY_HIGH,
                           f"between {PENALTY_LOW:g} and {PENALTY_HIGH:g} (1: none)"),
    "top_k": (True, lambda v: v >= 0, ">= 0 (0: no limit)"),
    "max_tokens": (True, lambda v: v >= 0, ">= 0"),
    "max_completion_tokens": (True, lambda v: v >= 0, ">= 0"),
    "seed": (True, lambda v: 0 <= v < 2**63, "between 0 and 2**63 - 1"),
}
MAX_DIGITS = 100  # a JSON integer longer than this is out of every range: not parsed at all


class LongNumber:
    """What read_json makes of an integer of over MAX_DIGITS digits: Python refuses to
    parse those above 4,300 (and parsing them costs quadratic time), and none is valid."""

    def __init__(self, digits):
        self.digits = digits

    def __repr__(self):
        return f"a {self.digits:,}-digit number"


def parse_int(text):
    """json.loads's parse_int: an int, or a LongNumber past MAX_DIGITS digits."""
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_DIGITS else LongNumber(digits)


def number(body, name, default=None):
    """body[name] when present and not null, checked against NUMBERS; else `default`."""
    integer, in_range, words = NUMBERS[name]
    value = body.get(name)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    if not (is_int(value) if integer else is_number(value)) or not in_range(value):
        shown = f"a {len(str(abs(value))):,}-digit number" if is_int(value) and abs(value) > 10**20 else repr(value)
        raise ApiError(400, f"{name} must be {kind} {words}, not {shown}"[:300], param=name)
    return value
# --- end of the numbers' checks ----------------------------------------------------------


def message_text(m, i):
    """A message's content: a string, or OpenAI's list of text parts joined."""
    content = m.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"messages[{i}].content must be a string (or a list of text parts)",
                   param=f"messages[{i}].content")


def check_messages(value):
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {\"role\": ..., \"content\": ...}", param="messages")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, not {role!r}"[:300],
                           param=f"messages[{i}].role")
        role = SAME_ROLE.get(m["role"], m["role"])
        if role == "system" and i != 0:
            raise ApiError(400, f"messages[{i}] is a {m['role']} message: only the first message may be one",
                           param=f"messages[{i}].role")
        messages.append({"role": role, "content": message_text(m, i)})
    if messages[-1]["role"] != "user":
        raise ApiError(400, "the last message must be the user's: the model writes the assistant's reply to it",
                       param="messages")
    return messages


def check_common(body, model_name, max_tokens_cap, default_max_tokens, serve_cfg):
    """(Sampling, stream, include_usage, gptkit extras) of a request body; ApiError for a mistake."""
    from gptkit.generation.sampling import check_sampling_options

    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = field(body, "model", lambda v: isinstance(v, str), "a string", model_name)
    if model != model_name:
        raise ApiError(404, f"the model {model!r}"[:200] + f" does not exist here: this server serves {model_name!r} "
                       "(GET /v1/models)", param="model", code="model_not_found")
    max_tokens = number(body, "max_completion_tokens")
    max_tokens = number(body, "max_tokens", max_tokens)
    asked = default_max_tokens if max_tokens is None else max_tokens
    used = min(asked, max_tokens_cap)
    temperature = number(body, "temperature", 1.0)
    top_p = number(body, "top_p")
    top_k = number(body, "top_k")
    min_p = number(body, "min_p")
    penalty = number(body, "repetition_penalty", 1.0)
    seed = number(body, "seed")
    seed = secrets.randbelow(2**62) if seed is None else seed
    stop = check_stop(body)
    try:
        check_sampling_options(temperature, top_k, top_p, min_p, penalty)
    except ValueError as e:
        raise ApiError(400, str(e))
    stream = field(body, "stream", lambda v: isinstance(v, bool), "true or false", False)
    options = field(body, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(400, "stream_options.include_usage must be true or false", param="stream_options")
    sampling = Sampling(max_new_tokens=used, temperature=float(temperature), top_k=top_k or None,
                        top_p=None if top_p is None else float(top_p), min_p=None if min_p is None else float(min_p),
                        repetition_penalty=float(penalty), stop=stop, seed=seed, compile=False,
                        cpu_decode=serve_cfg.cpu_decode, dtype=serve_cfg.dtype)
    extras = {"max_tokens": used, "max_tokens_capped": used < asked}
    return sampling, stream, include_usage, extras


def check_prompt(body):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string (or a list of one string)", param="prompt")
    return prompt


def new_id(prefix):
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens, completion_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_reply(rid, model, texts, start, done, extras, logprobs):
    """The reply of a chat request: texts[i] and logprobs[i] (an object or None) of choice i."""
    choices = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": c["finish_reason"],
                "logprobs": lp} for i, (text, c, lp) in enumerate(zip(texts, done["choices"], logprobs))]
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(start["prompt_tokens"], done["completion_tokens"]),
            "gptkit": {**extras, "dropped_messages": start["dropped_messages"]}}


def completion_reply(rid, model, texts, start, done, extras, logprobs):
    choices = [{"index": i, "text": text, "finish_reason": c["finish_reason"], "logprobs": lp}
               for i, (text, c, lp) in enumerate(zip(texts, done["choices"], logprobs))]
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(start["prompt_tokens"], done["completion_tokens"]), "gptkit": extras}


def chat_chunk(rid, model, delta, finish_reason=None, index=0, logprobs=None, **more):
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}],
            **more}


def completion_chunk(rid, model, text, finish_reason=None, index=0, logprobs=None, **more):
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}],
            **more}


class TextChunks:
    """A stream's text chunks as JSON text: json.dumps of chat_chunk(rid, model, {"content":
    text}, index=i, logprobs=lp) (or of completion_chunk(rid, model, text, ...)), byte for
    byte, with only the text, the time and the log-probabilities encoded per token: the
    rest of the object is the same in every chunk of a stream, so it is encoded once."""

    def __init__(self, rid, model, chat):
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head = json.dumps({"id": rid, "object": kind})[:-1] + ', "created": '
        self.middle = ', "model": ' + json.dumps(model) + ', "choices": [{"index": '
        self.field = ', "delta": {"content": ' if chat else ', "text": '
        self.close = '}, "finish_reason": null, "logprobs": ' if chat else ', "finish_reason": null, "logprobs": '

    def __call__(self, index, text, logprobs=None):
        return (f"{self.head}{int(time.time())}{self.middle}{index}{self.field}{json.dumps(text)}"
                f"{self.close}{json.dumps(logprobs)}}}]}}")


# --- the fields that choose how many replies and what comes with them (check_choices) ---

MAX_STOPS = 4  # OpenAI's limit
MAX_N = 16
MAX_TOP_LOGPROBS = {"chat": 20, "text": 5}  # OpenAI's limits: top_logprobs (chat), logprobs (completions)
# Present and not one of these harmless values: refused, naming the field.
UNSUPPORTED = {"tools": ([],), "tool_choice": ("none", "auto"), "functions": ([],), "function_call": ("none", "auto"),
               "response_format": ({"type": "text"},), "echo": (False,), "suffix": ("",), "logit_bias": ({},),
               "best_of": (1,)}


def check_stop(body):
    """`stop` as a tuple of non-empty strings (a string, or a list of up to MAX_STOPS), or None."""
    stop = field(body, "stop", lambda v: isinstance(v, (str, list)), "a string or a list of strings", None)
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of up to {MAX_STOPS} of them", param="stop")
    return tuple(stops) or None


def check_choices(body, kind):
    """(n, top_logprobs) of a request: how many choices, and None (no log-probabilities) or
    how many of the most likely tokens come with each chosen one. `kind` is "chat" (logprobs
    true/false and top_logprobs) or "text" (/v1/completions: logprobs is that number)."""
    for name, allowed in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value not in allowed:
            raise ApiError(400, f"the field {name!r} is not supported by this server", param=name,
                           code="unsupported_parameter")
    n = field(body, "n", is_int, "an integer", 1)
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be between 1 and {MAX_N}, not {n}", param="n")
    most = MAX_TOP_LOGPROBS[kind]
    if kind == "chat":
        wanted = field(body, "logprobs", lambda v: isinstance(v, bool), "true or false", False)
        top = field(body, "top_logprobs", is_int, "an integer", None)
        if top is not None and not wanted:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        name = "top_logprobs"
        top = (top or 0) if wanted else None
    else:
        top = field(body, "logprobs", is_int, "an integer", None)
        name = "logprobs"
    if top is not None and not 0 <= top <= most:
        raise ApiError(400, f"{name} must be between 0 and {most}, not {top}", param=name)
    return n, top


def token_bytes(text):
    return list(text.encode("utf-8"))


def chat_logprobs(entries):
    """OpenAI's chat `logprobs` object of [(token text, logprob, [(text, logprob)...])...]."""
    return {"content": [{"token": t, "logprob": p, "bytes": token_bytes(t),
                         "top_logprobs": [{"token": a, "logprob": b, "bytes": token_bytes(a)} for a, b in top]}
                        for t, p, top in entries]}


def completion_logprobs(entries, offset=0):
    """OpenAI's completions `logprobs` object; text_offset counts from `offset` characters."""
    offsets = []
    for t, _, _ in entries:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": [t for t, _, _ in entries], "token_logprobs": [p for _, p, _ in entries],
            "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}
