"""The config reader: a model repository's folders and config.pbtxt files, read into specs. Runs no model.

    specs.py              ModelSpec and the types it is made of (TensorSpec, BatchingSpec, VersionPolicy,
                          WarmupSample, SequenceSpec, ...): frozen records, no I/O
    repository.py         ModelRepository: model names, versions, config.pbtxt (or a JSON override) -> ModelSpec
    fields.py             what slotserve does with each config.pbtxt field (applied, refused, ignored)
    files.py              ModelRoots (where a model's files may be, how paths are shown), regular-file reading,
                          the files' stamp a reload compares
    sequence_batching.py  `sequence_batching` -> SequenceSpec
    ensemble_graph.py     `ensemble_scheduling` -> steps; the checks of an ensemble's graph and of calls across models
    warmup.py             `model_warmup` -> WarmupSamples, and a sample's input arrays

Layering: this package uses engine's shared vocabulary (engine/datatypes.py, errors.py, tensor_codec.py) and the
ModelConfig message (generated/), and nothing else of engine/: the backends (engine/interface.py and what
implements it) read specs, never the other way round. tests/unit/test_engine_layers.py holds it to that.
"""
