"""Training scripts the torch tests run as real jobs; none of them imports stallwatch."""

from __future__ import annotations

from pathlib import Path

# A train loop and an eval loop per epoch, DataLoader workers, two planted slow steps. It writes what it
# ran (and a checksum of the trained weights) to the JSON file named by its first argument.
TRAIN_AND_EVAL = '''
import json, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
EPOCHS, SLOW = {epochs}, {slow}
x = torch.randn(96, 32)
y = (x[:, 0] > 0).long()
train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True, num_workers={workers},
                   persistent_workers={workers} > 0, generator=torch.Generator().manual_seed(1))
evaluate = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
ran = {{"train": 0, "eval": 0}}
for epoch in range(EPOCHS):
    model.train()
    for xb, yb in train:
        if ran["train"] in SLOW:
            time.sleep(0.2)
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        ran["train"] += 1
    model.eval()
    with torch.no_grad():
        for xb, yb in evaluate:
            model(xb)
            ran["eval"] += 1
ran["checksum"] = float(sum(p.double().sum() for p in model.parameters()))
json.dump(ran, open(sys.argv[1], "w"))
'''


def write_train_and_eval(tmp_path: Path, *, epochs: int = 2, slow: tuple[int, ...] = (3, 7), workers: int = 2) -> Path:
    script = tmp_path / "train_and_eval.py"
    script.write_text(TRAIN_AND_EVAL.format(epochs=epochs, slow=set(slow) or "set()", workers=workers))
    return script
