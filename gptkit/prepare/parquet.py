"""Parquet inputs for prepare.py: one document per row, from one string column.

The web corpora (OpenWebText, FineWeb-Edu) are published as Parquet files with
a `text` column; `--text_column NAME` reads another. A file is read through
pyarrow in record batches of BATCH_ROWS rows of that one column (pre_buffer off,
so pyarrow streams each column chunk in BUFFER_BYTES reads instead of loading a
whole row group), so memory stays bounded whatever the file's size.

A null is an empty document (skipped, as an empty .txt file is). A text column may be
string, large_string, string_view or a dictionary of them (a pandas Categorical). Errors
name the file: not Parquet, no such column, a column that is not text.

For the checks and the progress bar the reader also feeds the file's raw bytes,
in order, to `on_raw` as it goes (after each batch, up to the share of rows done),
so the sha256 in meta.json is the file's own, as for every other input.
"""

from gptkit.ops.errors import UserError

BATCH_ROWS = 1024  # rows per record batch: a few MB of web text
BUFFER_BYTES = 1 << 20
RAW_BLOCK = 1 << 20


def _pyarrow():
    import pyarrow
    import pyarrow.parquet

    return pyarrow, pyarrow.parquet


def open_parquet(path, shown, column):
    """(ParquetFile, its row count), with the column checked; UserError naming the file."""
    pa, pq = _pyarrow()
    try:
        pf = pq.ParquetFile(path, buffer_size=BUFFER_BYTES, pre_buffer=False)
    except OSError as e:  # an unreadable file
        raise UserError(f"cannot read input {shown}: {e.strerror or e}")
    except (pa.ArrowException, ValueError) as e:  # ArrowInvalid: magic bytes or footer wrong
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"input {shown} is not a readable Parquet file ({reason})")
    schema = pf.schema_arrow
    if column not in schema.names:
        raise UserError(
            f"input {shown} has no column {column!r} (its columns: {', '.join(schema.names) or 'none'}): "
            "name the text column with --text_column NAME"
        )
    kind = schema.field(column).type
    if not is_text(kind):
        raise UserError(f"input {shown}: column {column!r} holds {kind}, not text (a string column)")
    return pf, pf.metadata.num_rows


def is_text(kind):
    """A string column in any of Arrow's layouts: string, large_string, string_view, or a
    dictionary of one of them (what pandas writes for a Categorical column)."""
    pa, _ = _pyarrow()
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    string_view = getattr(pa.types, "is_string_view", lambda t: False)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or string_view(kind)


def column_texts(column, source, first_row, errors):
    """A record batch's column as Python strings. Parquet's writers check UTF-8, but a
    file can still hold bytes that are not: named by row like a text file's bad bytes."""
    pa, _ = _pyarrow()
    if pa.types.is_dictionary(column.type):  # each row's own string (a batch's worth: bounded)
        column = column.dictionary_decode()
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        texts, as_bytes = [], pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        if getattr(pa.types, "is_string_view", lambda t: False)(column.type):
            as_bytes = pa.binary_view()
        for row, raw in enumerate(column.view(as_bytes).to_pylist(), first_row):
            try:
                texts.append(None if raw is None else raw.decode("utf-8", errors))
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{source.shown}, row {row}: not valid UTF-8 at byte {e.start} of its text ({e.reason}): "
                    "fix the file, or pass --errors replace to replace bad bytes with U+FFFD"
                ) from None
        return texts


def parquet_texts(source, errors, on_raw=None):
    """The text of each row of `source` (a Source of kind 'parquet'), nulls as ''."""
    pa, _ = _pyarrow()
    pf, n_rows = open_parquet(source.path, source.shown, source.column)
    size = source.path.stat().st_size
    raw = open(source.path, "rb") if on_raw else None
    fed = 0

    def feed_until(end):
        nonlocal fed
        while fed < end:
            block = raw.read(min(RAW_BLOCK, end - fed))
            if not block:
                break
            on_raw(block)
            fed += len(block)

    try:
        done = 0
        try:
            batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=[source.column], use_threads=False)
            for batch in batches:
                for text in column_texts(batch.column(0), source, done + 1, errors):
                    yield text or ""  # UTF-8 holds no lone surrogate: nothing more to check
                done += batch.num_rows
                if raw is not None and n_rows:
                    feed_until(size * done // n_rows)
        except (pa.ArrowException, OSError) as e:  # a damaged page, a truncated file
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"input {source.shown} could not be read past row {done:,} ({reason})")
        if raw is not None:
            feed_until(size)
    finally:
        if raw is not None:
            raw.close()
