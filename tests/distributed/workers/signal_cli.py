"""Worker: `smalltrain train --distributed` where rank 1 receives argv[1] (SIGINT or SIGTERM) during its first
epoch, while rank 0 trains on into the next all-reduce; the whole job must end with rank 1's message."""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from smalltrain import cli, train

original = train.Trainer.train_epoch


def train_epoch(self):
    if self.rank == 1:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return original(self)


train.Trainer.train_epoch = train_epoch
sys.exit(cli.main(["train", "--distributed", "--model", "mlp", "--epochs", "1", "--limit-train-batches", "50",
                   "--no-tensorboard", "--out", sys.argv[2]]))
