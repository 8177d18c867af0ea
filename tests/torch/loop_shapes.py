"""Training scripts of the loop shapes real public scripts have (none imports stallwatch). Each writes what it
ran to the JSON file named by its first argument."""

from __future__ import annotations

_HEAD = '''
import json, signal, sys
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the parent left (pytest in the background)
x = torch.randn(256, 16)
y = x @ torch.randn(16, 1)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
ran = {"train": 0, "eval": 0}
def done():
    json.dump(ran, open(sys.argv[1], "w"))
'''

# Manual SGD with a periodic estimate_loss() over tensor slices (no optimizer, no DataLoader): the shape of
# the word-level LSTM and minimal nanoGPT scripts.
MANUAL_SGD = _HEAD + '''
@torch.no_grad()
def estimate_loss():
    model.eval()
    for k in range(3):
        model(x[k * 32:(k + 1) * 32])
        ran["eval"] += 1
    model.train()
for it in range(20):
    if it % 5 == 0:
        estimate_loss()
    i = (it * 16) % 224
    loss = ((model(x[i:i + 32]) - y[i:i + 32]) ** 2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.01)
    ran["train"] += 1
done()
'''

# LBFGS: the closure runs forward and backward inside optimizer.step() several times per step.
LBFGS = _HEAD + '''
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
for it in range(6):
    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss
    opt.step(closure)
    ran["train"] += 1
done()
'''

# pytorch/examples' time_sequence_prediction: an LBFGS closure with a loss module (nn.MSELoss, no parameters),
# then, each iteration, a prediction and its loss under no_grad (the loss module called on its own).
TIME_SEQUENCE = _HEAD + '''
criterion = nn.MSELoss()
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
for it in range(4):
    def closure():
        opt.zero_grad()
        loss = criterion(model(x[:200]), y[:200])
        loss.backward()
        return loss
    opt.step(closure)
    ran["train"] += 1
    with torch.no_grad():
        criterion(model(x[200:]), y[200:])
        ran["eval"] += 1
done()
'''

# Gradient accumulation over tensor slices: four micro-batches per optimizer step.
ACCUMULATION = _HEAD + '''
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(8):
    for micro in range(4):
        i = (it * 4 + micro) * 8 % 248
        (((model(x[i:i + 8]) - y[i:i + 8]) ** 2).mean() / 4).backward()
    opt.step()
    opt.zero_grad()
    ran["train"] += 1
done()
'''

# A DataLoader training loop interrupted by Ctrl-C inside the forward of its 6th step.
INTERRUPTED = _HEAD + '''
import os
from torch.utils.data import DataLoader, TensorDataset
class Interrupting(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = model
    def forward(self, xb):
        if ran["train"] == 5:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the KeyboardInterrupt is raised in here
                torch.mm(xb.T, xb)
        return self.body(xb)
net = Interrupting()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
try:
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        ran["train"] += 1
except KeyboardInterrupt:
    done()
    raise
'''

# Forward passes with autograd on and nothing else: no backward, no optimizer, no DataLoader.
FORWARD_ONLY = _HEAD + '''
for it in range(12):
    model(x[it * 16:(it + 1) * 16])
    ran["eval"] += 1
done()
'''

# A loop without a DataLoader that builds its batches by hand and reads the loss after the update: on a GPU,
# `loss.item()` waits there for the step's kernels (here a 20 ms sleep stands for that wait). Each iteration's
# wall time is written, from one top of the loop to the next.
SYNC_AFTER_UPDATE = _HEAD + '''
import time
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ran["iterations_us"] = []
top = time.time_ns() // 1000
for it in range(12):
    i = (it * 16) % 224
    xb = torch.stack([row.flip(0) for row in x[i:i + 32]])  # batch built by hand, in the loop
    loss = ((model(xb) - y[i:i + 32]) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.02)  # loss.item() waiting for the GPU
    ran["train"] += 1
    now = time.time_ns() // 1000
    ran["iterations_us"].append(now - top)
    top = now
done()
'''

# A GAN without a DataLoader: the discriminator's update, then the generator's, each iteration; and the
# generator's optimizer wrapped by another (Lookahead-style: the wrapper's step() steps the inner optimizer).
GAN_TWO_OPTIMIZERS = _HEAD + '''
class Wrapped(torch.optim.Optimizer):
    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})
    def step(self, closure=None):
        return self.inner.step(closure)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
D = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
opt_d = torch.optim.Adam(D.parameters(), 1e-3)
opt_g = Wrapped(torch.optim.Adam(G.parameters(), 1e-3))
bce = nn.BCEWithLogitsLoss()
for it in range(10):
    real = x[it * 16:(it + 1) * 16]
    fake = G(torch.randn(16, 8))
    loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
    opt_d.zero_grad(); loss_d.backward(); opt_d.step()
    loss_g = bce(D(fake), torch.ones(16, 1))
    opt_g.zero_grad(); loss_g.backward(); opt_g.step()
    ran["train"] += 1
done()
'''

# Mixed precision with a GradScaler and no DataLoader: the scaler skips optimizer.step() on the iterations whose
# gradients overflow (the first ones, while it finds its scale, and now and then later).
AMP_SKIPPED_STEPS = _HEAD + '''
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
for it in range(12):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = ((model(x[it * 16:(it + 1) * 16]).float() - y[it * 16:(it + 1) * 16]) ** 2).mean()
    if it in (0, 1, 2, 7):
        loss = loss * float("inf")  # an overflow: the scaler skips this iteration's update
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    ran["train"] += 1
done()
'''
