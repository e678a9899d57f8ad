#!/usr/bin/python3
"""KLD against bits per weight (linears) for lowbit presets and llama.cpp types, from compare_llamacpp.sh's kld.tsv.

    /usr/bin/python3 scripts/plot_kld_bpw.py KLD_TSV OUT_PNG [--title TITLE]

Uses Debian's python3-matplotlib (scripts/install-deps.sh). Log-scale KLD; each point labelled with its type.
"""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tsv")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.tsv), delimiter="\t"))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for tool, marker in (("llama.cpp", "o"), ("lowbit", "s")):
        pts = sorted((float(r["bpw_linears"]), float(r["kld"]), r["type"]) for r in rows if r["tool"] == tool)
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=tool)
        for x, y, name in pts:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (layer linears)")
    ax.set_ylabel("KL divergence from the source (WikiText-2)")
    ax.set_title(f"KLD against size: {a.title}" if a.title else "KLD against size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
