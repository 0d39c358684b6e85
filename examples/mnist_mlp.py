"""A multilayer perceptron on MNIST, written the PyTorch way; only the imports differ from the PyTorch script.

Run: python examples/mnist_mlp.py [--epochs 3] [--limit 512] [--batch-size 64] [--lr 1e-3]
"""
import argparse
import math

import smalltrain as torch                       # was: import torch
from smalltrain import nn, optim                 # was: from torch import nn, optim
from smalltrain import datasets, transforms      # was: from torchvision import datasets, transforms
from smalltrain.utils.data import DataLoader, Subset   # was: from torch.utils.data import DataLoader, Subset


class MLP(nn.Module):
    def __init__(self, hidden=256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x):
        return self.net(x)


def train(model, device, loader, optimizer, criterion):
    model.train()
    total = 0.0
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(data)
    return total / len(loader.dataset)


def evaluate(model, device, loader, criterion):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += criterion(output, target).item() * len(data)
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(loader.dataset)
    return loss / n, correct / n


def main(argv=None):
    parser = argparse.ArgumentParser(description="MNIST MLP")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="train and test on the first N samples only")
    parser.add_argument("--data", default="./data", help="MNIST root (found there, else fetched)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(args.data, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(args.data, train=False, download=True, transform=transform)
    if args.limit:
        train_set, test_set = Subset(train_set, range(args.limit)), Subset(test_set, range(args.limit))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1000)

    model = MLP().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train_loss = train(model, device, train_loader, optimizer, criterion)
        test_loss, accuracy = evaluate(model, device, test_loader, criterion)
        print(f"epoch {epoch}: train loss {train_loss:.4f}, test loss {test_loss:.4f}, accuracy {accuracy:.4f}")
    assert math.isfinite(test_loss)
    print(f"final: loss={test_loss:.6f} accuracy={accuracy:.4f}")
    return test_loss, accuracy


if __name__ == "__main__":
    main()
