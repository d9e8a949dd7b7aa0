"""The tool a chat model may call: a calculator of arithmetic only.

    python -c "from gptkit.generation.tools import calculate; print(calculate('1234*5678'), calculate('9**9**9'))"

The model writes an expression between <|call|> and <|/call|> (gptkit/data/chat.py);
generation runs `calculate` on it and forces the answer, or a one-line "error: ..."
(as nanochat's engine does), into the reply between <|output|> and <|/output|>.
The expression is text a model wrote, so it is read as untrusted input: parsed with
Python's `ast` and walked here, never given to eval. Only number literals, + - * / //
% **, unary + and -, and parentheses are taken; a name, a call, an attribute, a
string or anything else is an error. Every way to make the work large is bounded
before it is done: the expression's length, its nesting, each literal's digits, and
each result's size (a product's or a power's estimated from its operands' sizes, so
9**9**9 is refused without being computed), with a time limit over the whole walk.
"""

import ast
import math
import operator
import time

from gptkit.ops.errors import UserError

MAX_LENGTH = 200  # characters of an expression
MAX_DEPTH = 30  # nested operations and parentheses
MAX_LITERAL_DIGITS = 30  # digits of one number as written
MAX_RESULT_BITS = 1024  # of any integer on the way (about 308 digits, a float's range)
TIME_LIMIT = 0.05  # seconds for the whole walk: far more than any bounded expression takes

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(Exception):
    """Why an expression has no answer here: the one line the model sees."""


def calculate(expression):
    """The value of an arithmetic expression as text ("7006652", "3.5"), or "error: ..." in
    one line: never raises, never runs anything but arithmetic on bounded numbers."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:
        return f"error: {e}"


def evaluate(expression):
    """The number an expression is, or a CalculatorError."""
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # ValueError: a null character
        raise CalculatorError("not an arithmetic expression") from None
    deadline = time.perf_counter() + TIME_LIMIT
    return walk(tree.body, 0, deadline)


def walk(node, depth, deadline):
    """The value of one node of the parsed expression, its operands first."""
    if depth > MAX_DEPTH:
        raise CalculatorError(f"nested more than {MAX_DEPTH} deep")
    if time.perf_counter() > deadline:
        raise CalculatorError("took too long")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, complex or str
        return literal(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](walk(node.operand, depth + 1, deadline))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        a, b = walk(node.left, depth + 1, deadline), walk(node.right, depth + 1, deadline)
        return apply(type(node.op), a, b)
    raise CalculatorError("only numbers, + - * / // % **, and parentheses")


def literal(value):
    if isinstance(value, int) and len(str(abs(value))) > MAX_LITERAL_DIGITS:  # at most MAX_LENGTH digits to write
        raise CalculatorError(f"a number longer than {MAX_LITERAL_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("a number too large")
    return value


def apply(op, a, b):
    """a op b, refused before computing when its size would pass the bounds."""
    if op is ast.Pow and isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        if b * a.bit_length() > MAX_RESULT_BITS + b:  # |a|**b has more than (bits(a) - 1) * b bits
            raise CalculatorError("the result would be too large")
    if op is ast.Mult and isinstance(a, int) and isinstance(b, int):
        if a.bit_length() + b.bit_length() > MAX_RESULT_BITS + 1:
            raise CalculatorError("the result would be too large")
    try:
        value = BINARY[op](a, b)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large") from None
    if isinstance(value, complex):  # a negative number to a fractional power
        raise CalculatorError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is too large")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError("the result would be too large")
    return value


def format_number(value):
    """An integer in full, a float as Python writes it shortest (0.1, 3.5, 1e-07), and a
    whole float of up to 15 digits as the integer it is (48/2 is "24", as a person writes
    it and GSM8K's annotations give it)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else repr(value)


def run_call(reply, tokenizer, special):
    """The call a reply's tokens end with (its last token <|/call|>), run: {"expression",
    "output", "ids"}, ids being the tokens forced into the reply: <|output|>, the output,
    <|/output|>. The expression is the text after the reply's last <|call|> (all of the
    reply after its last output if the model wrote no <|call|>: the calculator says why
    that is no expression)."""
    opening = [i for i, t in enumerate(reply[:-1]) if t in (special["<|call|>"], special["<|/output|>"])]
    start = opening[-1] + 1 if opening else 0
    expression = tokenizer.decode([t for t in reply[start:-1] if t < tokenizer.vocab_size])
    output = calculate(expression)
    return {"expression": expression, "output": output,
            "ids": [special["<|output|>"], *encode_output(output, tokenizer), special["<|/output|>"]]}


def encode_output(text, tokenizer):
    """The output's tokens: a character-level vocabulary may lack some of an error's letters,
    which are left out (the model reads what its vocabulary can say)."""
    try:
        return tokenizer.encode(text)
    except UserError:  # characters outside a char vocabulary
        return [t for ch in text for t in encodable(ch, tokenizer)]


def encodable(ch, tokenizer):
    try:
        return tokenizer.encode(ch)
    except UserError:
        return []
