"""What the SAC command-line tests share."""

# A small train-only text (4.5k characters) instead of the CPU preset's 345k of classical/: the same code path
# and the same mixed supervised batches (corpus_share), with |Σ| 919 instead of 6,225, at about a quarter of the
# CPU per run. The SAC kill/resume shards, the planted-files CLI test and the SAC CLI tests train on it.
SMALL_CORPUS_ARGS = ("--extra_train_corpus", "classical/sishu/zhongyong.json")
