"""Arrow and Spark helpers the stages share: DataFrames of driver-side
tables and arrays (:func:`_frame`, :func:`_local`), a DataFrame's rows on
the driver (:func:`_to_arrow`), fixed-width binary columns
(:func:`_fixed_rows`, :func:`_packed`), text buffers for Rust
(:func:`_text_buffers`), and the scored pairs' schema."""

from __future__ import annotations

from typing import Any

import numpy as np

import neardup


def _fixed_rows(data: bytes, rows: int) -> Any:
    """``rows`` rows of equal width packed in ``data``, as an Arrow binary column."""
    import pyarrow as pa

    width = len(data) // max(rows, 1)
    offsets = np.arange(rows + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


def _packed(column: Any) -> bytes:
    """An Arrow binary column's values, one after another."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    return arr.buffers()[2][int(offs[0]) : int(offs[-1])].to_pybytes() if len(arr) else b""


def _scored_pair_schema() -> Any:
    """The distributed path's pairs: (``pa``, ``pb``, ``distance``, ``score``)."""
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("pa", T.LongType(), False),
        T.StructField("pb", T.LongType(), False),
        T.StructField("distance", T.LongType(), False),
        T.StructField("score", T.DoubleType(), False),
    ])


def _text_buffers(arr: Any) -> tuple:
    try:
        return neardup._string_buffers(arr)
    except TypeError:
        raise neardup.NeardupError(f"the text column holds {arr.type}, not strings") from None


def _to_arrow(frame: Any) -> Any:
    """A DataFrame's rows on the driver as one pyarrow Table."""
    import pyarrow as pa

    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    return pa.Table.from_batches(frame._collect_as_arrow(), schema=None)  # pyspark 3.5


def _frame(spark: Any, table: Any) -> Any:
    """A DataFrame of a driver-side pyarrow Table."""
    try:
        return spark.createDataFrame(table)  # pyspark 4
    except TypeError:
        from pyspark.sql.pandas.types import from_arrow_schema

        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))


def _zero(t: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_binary(t):
        return b""
    if pa.types.is_string(t):
        return ""
    if pa.types.is_boolean(t):
        return False
    return 0


def _local(spark: Any, columns: dict) -> Any:
    """A DataFrame of driver-side numpy columns (int64 or float64), by Arrow."""
    import pyarrow as pa
    from pyspark.sql import types as T

    table = pa.table({name: pa.array(np.asarray(v)) for name, v in columns.items()})
    if table.num_rows == 0:
        types = {pa.int64(): T.LongType(), pa.float64(): T.DoubleType()}
        schema = T.StructType([T.StructField(f.name, types[f.type]) for f in table.schema])
        return spark.createDataFrame([], schema)
    try:
        return spark.createDataFrame(table)  # pyspark 4
    except TypeError:
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        return spark.createDataFrame(table.to_pandas())


def _arrow_type(t: Any) -> Any:
    import pyarrow as pa
    from pyspark.sql import types as T

    return {
        T.LongType: pa.int64(),
        T.BinaryType: pa.binary(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.StringType: pa.string(),
        T.ByteType: pa.int8(),
        T.IntegerType: pa.int32(),
    }[type(t)]
