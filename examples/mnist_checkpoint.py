"""Saving and reloading the PyTorch way: the model's state_dict alone, then a full checkpoint (epoch, model and
optimizer state, loss) that a fresh model and optimizer resume from. Only the imports differ from PyTorch.

Run: python examples/mnist_checkpoint.py [--epochs 2] [--limit 512] [--out checkpoints]
"""
import argparse
import os

import smalltrain as torch                       # was: import torch
from smalltrain import nn, optim                 # was: from torch import nn, optim
from smalltrain import datasets, transforms      # was: from torchvision import datasets, transforms
from smalltrain.utils.data import DataLoader, Subset   # was: from torch.utils.data import DataLoader, Subset


def make_model():
    return nn.Sequential(nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 12 * 12, 10))


def run_epoch(model, loader, criterion, optimizer=None):
    """One pass: trains when an optimizer is given, else evaluates. Returns (mean loss, accuracy)."""
    model.train(optimizer is not None)
    total, correct = 0.0, 0
    with torch.set_grad_enabled(optimizer is not None):
        for x, y in loader:
            out = model(x)
            loss = criterion(out, y)
            if optimizer is not None:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            total += loss.item() * len(x)
            correct += (out.argmax(1) == y).sum().item()
    return total / len(loader.dataset), correct / len(loader.dataset)


def main(argv=None):
    parser = argparse.ArgumentParser(description="save and resume")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", default="checkpoints")
    parser.add_argument("--data", default="./data", help="MNIST root (found there, else fetched)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set, test_set = datasets.MNIST(args.data, train=True, download=True, transform=tf), \
        datasets.MNIST(args.data, train=False, download=True, transform=tf)
    if args.limit:
        train_set, test_set = Subset(train_set, range(args.limit)), Subset(test_set, range(args.limit))
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=500)
    os.makedirs(args.out, exist_ok=True)

    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        train_loss, _ = run_epoch(model, train_loader, criterion, optimizer)
    test_loss, accuracy = run_epoch(model, test_loader, criterion)
    print(f"trained: test loss {test_loss:.4f}, accuracy {accuracy:.4f}")

    # 1. the weights alone
    weights_path = os.path.join(args.out, "model_weights.pt")
    torch.save(model.state_dict(), weights_path)
    reloaded = make_model()
    reloaded.load_state_dict(torch.load(weights_path, weights_only=True))
    same_loss, same_acc = run_epoch(reloaded, test_loader, criterion)
    assert (same_loss, same_acc) == (test_loss, accuracy), "reloaded weights evaluate differently"

    # 2. a checkpoint to resume training from
    checkpoint_path = os.path.join(args.out, "checkpoint.pt")
    torch.save({
        "epoch": args.epochs,
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": optimizer.state_dict(),
        "loss": train_loss,
    }, checkpoint_path)
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    resumed = make_model()
    resumed_optimizer = optim.Adam(resumed.parameters(), lr=1e-3)
    resumed.load_state_dict(checkpoint["model_state_dict"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    start_epoch = checkpoint["epoch"]
    print(f"resuming at epoch {start_epoch} (train loss then {checkpoint['loss']:.4f})")
    run_epoch(resumed, train_loader, criterion, resumed_optimizer)
    test_loss, accuracy = run_epoch(resumed, test_loader, criterion)
    print(f"final: loss={test_loss:.6f} accuracy={accuracy:.4f}")


if __name__ == "__main__":
    main()
