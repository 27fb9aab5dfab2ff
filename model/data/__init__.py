"""Training data: where text comes from, how it is stored once tokenized, how batches are drawn.

documents     what a source is: a stream of documents with an identity, or a SourceError
sources       the SOURCE names (builtin, shakespeare, openwebtext, alpaca, hf:..., files)
source_files  your own .txt/.md/.jsonl/.parquet files as a source
token_format  a prepared dataset on disk: train.bin, val.bin, meta.json
batches       training batches: random block_size windows, a pure function of the step
"""
