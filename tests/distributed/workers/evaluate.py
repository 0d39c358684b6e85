"""Worker: the trainer's sharded evaluation against a single-process evaluation of the same parameters.

`python evaluate.py OUT` under mpiexec -n N: builds the trainer exactly as `smalltrain train --distributed` does
(MLP, the bundled MNIST, its test loader sharded over the ranks), trains 20 steps so that the model is not at its
random start (losses and predictions then vary from sample to sample), then evaluates twice with the same
parameters: trainer.evaluate() (each rank its shard, sums and counts all-reduced) and smalltrain.train.evaluate on
the whole test set in this one process, no communication. Writes rank<r>.json to OUT.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import smalltrain.distributed as dist


def main(out_dir):
    group = dist.init_process_group("mpi")   # first: an exception from here on aborts every rank
    from smalltrain.train import TrainConfig, Trainer, evaluate
    from smalltrain.utils.data import DataLoader
    out = Path(out_dir)
    cfg = TrainConfig(model="mlp", epochs=1, limit_train_batches=20, tensorboard=False, progress=False,
                      out=str(out / "run"), distributed=True)
    trainer = Trainer(cfg, group)
    trainer.train_epoch()
    sharded = trainer.evaluate()
    whole = evaluate(trainer.module, DataLoader(trainer.test_set, batch_size=cfg.eval_batch_size), "cpu", None)
    shard = list(trainer.test_loader.sampler or [])
    info = {"rank": group.rank, "world": group.world_size, "sharded": sharded, "whole": whole,
            "test_set": len(trainer.test_set), "shard_size": len(shard), "shard_indices": [int(i) for i in shard]}
    (out / f"rank{group.rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
