"""A plain Keras 3 job (run as a script, the backend from KERAS_BACKEND): `fit` with validation, then
`evaluate` and `predict`, writing what it ran to a JSON file. It never imports stallwatch unless asked to
pass `stallwatch.keras.ProfilerCallback` itself.

    python keras_job.py OUT.json {arrays|slow|workers} [callback RUN_DIR]

arrays: NumPy arrays in memory (no input bottleneck). slow: a PyDataset whose __getitem__ sleeps 20 ms in
the training thread (workers=1, Keras's default): the planted input bottleneck. workers: the same PyDataset
made by 2 forked worker processes (workers=2, use_multiprocessing=True), which Keras terminates with SIGTERM."""

import json
import os
import sys
import time

import keras
import numpy as np

TRAIN_BATCHES, VAL_BATCHES, EVAL_BATCHES, PREDICT_BATCHES, EPOCHS, BATCH = 120, 3, 4, 2, 1, 16
SLEEP_S = float(os.environ.get("KERAS_JOB_SLEEP_S", "0.020"))


class SlowData(keras.utils.PyDataset):
    """Batches made in the training thread, each after a planted 20 ms sleep (a slow read)."""

    def __init__(self, x, y, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        time.sleep(SLEEP_S)
        return self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]


def main() -> None:
    out, scenario = sys.argv[1], sys.argv[2]
    callbacks = []
    if len(sys.argv) > 3 and sys.argv[3] == "callback":
        from stallwatch.keras import ProfilerCallback

        callbacks = [ProfilerCallback(out=sys.argv[4])]
    rng = np.random.default_rng(0)
    x = rng.random((TRAIN_BATCHES * BATCH, 32), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    xv, yv = x[:VAL_BATCHES * BATCH], y[:VAL_BATCHES * BATCH]
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    dataset = scenario in ("slow", "workers")
    train = (SlowData(x, y, workers=2, use_multiprocessing=True) if scenario == "workers" else SlowData(x, y)) \
        if dataset else x
    model.fit(train, None if dataset else y, batch_size=None if dataset else BATCH,
              epochs=EPOCHS, validation_data=(xv, yv), validation_batch_size=BATCH, verbose=0, callbacks=callbacks)
    model.evaluate(x[:EVAL_BATCHES * BATCH], y[:EVAL_BATCHES * BATCH], batch_size=BATCH, verbose=0,
                   callbacks=callbacks)
    model.predict(x[:PREDICT_BATCHES * BATCH], batch_size=BATCH, verbose=0, callbacks=callbacks)
    with open(out, "w") as f:
        json.dump({"backend": keras.backend.backend(), "train": TRAIN_BATCHES * EPOCHS,
                   "test": VAL_BATCHES * EPOCHS + EVAL_BATCHES, "predict": PREDICT_BATCHES}, f)


if __name__ == "__main__":
    main()
