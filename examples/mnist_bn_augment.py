"""A conv-BatchNorm network trained with data augmentation (random crop with padding, small rotations and
translations), written the PyTorch way: only the imports differ (smalltrain.transforms for torchvision's).

Run: python examples/mnist_bn_augment.py [--epochs 3] [--limit 512] [--workers 0]
"""
import argparse
import math

import smalltrain as torch                       # was: import torch
from smalltrain import nn, optim                 # was: from torch import nn, optim
from smalltrain import datasets, transforms      # was: from torchvision import datasets, transforms
from smalltrain.utils.data import DataLoader, Subset   # was: from torch.utils.data import DataLoader, Subset


def conv_bn(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))


class ConvBNNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(conv_bn(1, 16), nn.MaxPool2d(2), conv_bn(16, 32), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 7 * 7, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def main(argv=None):
    parser = argparse.ArgumentParser(description="MNIST conv-BN with augmentation")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="train and test on the first N samples only")
    parser.add_argument("--data", default="./data", help="MNIST root (found there, else fetched)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True        # accepted; smalltrain has no cuDNN to tune
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")

    normalize = transforms.Normalize((0.1307,), (0.3081,))
    train_tf = transforms.Compose([
        transforms.RandomCrop(28, padding=2),
        transforms.RandomAffine(degrees=10, translate=(0.1, 0.1)),
        transforms.ToTensor(),
        normalize,
    ])
    test_tf = transforms.Compose([transforms.ToTensor(), normalize])
    train_set = datasets.MNIST(args.data, train=True, download=True, transform=train_tf)
    test_set = datasets.MNIST(args.data, train=False, download=True, transform=test_tf)
    if args.limit:
        train_set, test_set = Subset(train_set, range(args.limit)), Subset(test_set, range(args.limit))
    g = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=g)
    test_loader = DataLoader(test_set, batch_size=1000)

    model = ConvBNNet().to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.05)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, epochs=args.epochs,
                                              steps_per_epoch=len(train_loader))
    for epoch in range(1, args.epochs + 1):
        model.train()
        running = 0.0
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += loss.item() * images.size(0)
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for images, labels in test_loader:
                images, labels = images.to(device), labels.to(device)
                logits = model(images)
                test_loss += nn.functional.cross_entropy(logits, labels, reduction="sum").item()
                correct += (logits.argmax(1) == labels).sum().item()
        n = len(test_loader.dataset)
        print(f"epoch {epoch}: train loss {running / len(train_loader.dataset):.4f}, "
              f"test loss {test_loss / n:.4f}, accuracy {correct / n:.4f}")
    assert math.isfinite(test_loss)
    print(f"final: loss={test_loss / n:.6f} accuracy={correct / n:.4f}")


if __name__ == "__main__":
    main()
