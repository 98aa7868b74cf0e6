#!/usr/bin/env python3
"""Transcribe the paper's main comparison (Table 1, \\label{table:exp1_9k_main}) from its LaTeX
source into table1.csv, once. Run from the repository root:

    python3 experiments/published/transcribe.py ../shared/paper/eci-pp.tex > experiments/published/table1.csv

Each row of the LaTeX table is `& & METRIC & \\textcolor{blue}{TRAIN}, TEST & ...` (values
possibly wrapped in \\textbf / \\underline), seven methods per row, datasets in \\multirow
cells, the single-expert block (lv0.01) before the multi-expert block (multi3). Pretraining:
the paper's main table pretrains every method that has a pretraining stage (all but
VanillaDCC and VolMaxDCC); 9,000 constraints, corruption 0.3.
"""
import re
import sys

METHODS = ["vanilla-dcc", "volmax-dcc", "cidec", "spherepair", "probpair", "weighted-probpair", "eci-pp"]
PRETRAINED = {"cidec", "spherepair", "probpair", "weighted-probpair", "eci-pp"}


def number(cell):
    cell = re.sub(r"\\(textbf|underline)\{([^{}]*)\}", r"\2", cell)
    return float(cell.strip())


def main(path):
    tex = open(path, encoding="utf-8").read()
    start = tex.index(r"\label{table:exp1_9k_main}")
    body = tex[start:tex.index(r"\end{tabular}", start)]
    print("table,dataset,supervision,method,pretrain,corruption,budget,metric,split,value")
    supervision, dataset = None, None
    for line in body.splitlines():
        if "Single-" in line:
            supervision = "lv0.01"
        if "Multi-" in line:
            supervision = "multi3"
        m = re.search(r"\\raisebox\{[^}]*\}\{(CIFAR100|CIFAR10|FMNIST|ImageNet10|MNIST|REUTERS|STL10|RCV1-10)\}", line)
        if m:
            dataset = m.group(1)
        m = re.search(r"& (ACC|NMI|ARI) & (.*)\\\\", line)
        if not m:
            continue
        metric, rest = m.group(1), m.group(2)
        cells = [c.strip() for c in rest.split("&")]
        assert len(cells) == len(METHODS), (line, cells)
        for method, cell in zip(METHODS, cells):
            t = re.match(r"\\textcolor\{blue\}\{(.*)\},\s*(.*)$", cell)
            assert t, cell
            for split, value in (("train", number(t.group(1))), ("test", number(t.group(2)))):
                pre = "true" if method in PRETRAINED else "false"
                print(f"table1,{dataset},{supervision},{method},{pre},0.3,9000,{metric},{split},{value}")


if __name__ == "__main__":
    main(sys.argv[1])
