#!/usr/bin/env python3
"""Transcribe the paper's tables of clustering scores from its LaTeX source, once. Run from the
repository root:

    python3 experiments/published/transcribe.py ../shared/paper/eci-pp.tex table1 > experiments/published/table1.csv
    python3 experiments/published/transcribe.py ../shared/paper/eci-pp.tex table10 > experiments/published/table10.csv
    python3 experiments/published/transcribe.py ../shared/paper/eci-pp.tex other > experiments/published/other-tables.csv

`other` writes the paper's tables that are not clustering scores (Tables 2-6 and 11) as
`table,row,column,value`, the value as printed (LaTeX markup removed: $10^{-3}$ -> 1e-3).

Tables 7, 8 and 9 (table:exp1_1_pretrain, table:exp1_2_no_ensemble, table:exp1_1_nopretrain)
have captions but no tabular body in the source, so there is nothing to transcribe for them.

Table 1 (table:exp1_9k_main):
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


HEADER = "table,dataset,supervision,method,pretrain,corruption,budget,metric,split,value"

# One spelling per dataset in every CSV: the one the paper uses most (its Tables 1 and 10
# print CIFAR100 and REUTERS in their row labels, the rest of the paper CIFAR100-20 and Reuters).
CANONICAL = {"CIFAR100": "CIFAR100-20", "REUTERS": "Reuters"}


def canonical(name):
    return CANONICAL.get(name, name)


def train_test(cell):
    t = re.match(r"\\textcolor\{blue\}\{(.*)\},\s*(.*)$", cell.strip())
    assert t, cell
    return number(t.group(1)), number(t.group(2))


def table10(tex):
    """Table 10 (table:exp1_2_ensemble_vs_ecu): rows dataset × method (SP-EA, WPP-EA, ECI-PP),
    columns 3k/6k/9k × ACC/NMI/ARI, multi3, corruption 0.3, pretrained backbones."""
    start = tex.index(r"\label{table:exp1_2_ensemble_vs_ecu}")
    body = tex[start:tex.index(r"\end{tabular}", start)]
    names = {r"SP$^{\mathrm{EA}}$": "sp-ea", r"WPP$^{\mathrm{EA}}$": "wpp-ea", r"\makecell{ECI-PP}": "eci-pp"}
    print(HEADER)
    dataset = None
    for line in body.splitlines():
        m = re.search(r"\\multirow\{3\}\{\*\}\{([^}]*)\}", line)
        if m:
            dataset = canonical(m.group(1))
        cells = [c.strip() for c in line.strip().rstrip("\\").split("&")]
        if len(cells) != 11 or cells[1] not in names:
            continue
        method = names[cells[1]]
        values = cells[2:]
        for b, budget in enumerate((3000, 6000, 9000)):
            for k, metric in enumerate(("ACC", "NMI", "ARI")):
                train, test = train_test(values[3 * b + k])
                for split, value in (("train", train), ("test", test)):
                    print(f"table10,{dataset},multi3,{method},true,0.3,{budget},{metric},{split},{value}")


OTHER = [
    ("table2", "tab:multi_expert_blind_counts"),
    ("table3", "tab:single_expert_acc"),
    ("table4", "tab:multi_expert_avg_acc"),
    ("table5", "tab:volmax_lambda_selection"),
    ("table6", "tab:expert_aware_alpha_selection"),
    ("table11", "tab:runtime_summary"),
]


def plain(cell):
    cell = cell.strip()
    cell = re.sub(r"\\(underline|textbf|texttt)\{([^{}]*)\}", r"\2", cell)
    cell = re.sub(r"\{\\tt\s+([^{}]*)\}", r"\1", cell)
    m = re.fullmatch(r"\$10\^\{(-?\d+)\}\$", cell)
    if m:
        return "1e" + m.group(1)
    cell = cell.replace("$^\\ast$", "*").replace("$", "")
    return cell.strip()


def other(tex):
    print("table,row,column,value")
    for name, label in OTHER:
        start = tex.index("\\label{" + label + "}")
        body = tex[start:tex.index(r"\end{tabular}", start)]
        body = body[body.index(r"\begin{tabular}"):]
        rows = [l.strip() for l in body.split("\\\\")]
        rows = [re.sub(r"\\(toprule|midrule|bottomrule)", "", r).strip() for r in rows]
        rows = [r for r in rows if "&" in r]
        header = [plain(c) for c in rows[0].split("&")]
        for r in rows[1:]:
            cells = [plain(c) for c in r.split("&")]
            assert len(cells) == len(header), (label, r)
            for col, value in zip(header[1:], cells[1:]):
                print(f"{name},\"{cells[0]}\",\"{col}\",\"{value}\"")


def table1(tex):
    start = tex.index(r"\label{table:exp1_9k_main}")
    body = tex[start:tex.index(r"\end{tabular}", start)]
    print(HEADER)
    supervision, dataset = None, None
    for line in body.splitlines():
        if "Single-" in line:
            supervision = "lv0.01"
        if "Multi-" in line:
            supervision = "multi3"
        m = re.search(r"\\raisebox\{[^}]*\}\{(CIFAR100|CIFAR10|FMNIST|ImageNet10|MNIST|REUTERS|STL10|RCV1-10)\}", line)
        if m:
            dataset = canonical(m.group(1))
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
    tex = open(sys.argv[1], encoding="utf-8").read()
    {"table1": table1, "table10": table10, "other": other}[sys.argv[2] if len(sys.argv) > 2 else "table1"](tex)
