"""Pictures: NI routing through function iterations (NI Fig. 3) and NAC circuits (NAC Fig. 8)."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
from torch import Tensor

__all__ = ["routing_graph", "draw_routing", "draw_function_shares", "draw_circuit"]


def routing_graph(compat: Tensor, token: int | None = None, min_weight: float = 1e-3) -> nx.DiGraph:
    """A layered graph of how tokens flow through functions over successive iterations.

    Args:
        compat: compatibilities of one sample, ``(steps, U, T)`` (e.g. ``NIOutput.compatibilities``
            of all scripts concatenated along the step axis, for one sample).
        token: follow one token; by default, average over all tokens.
        min_weight: drop edges lighter than this.

    Nodes are ``"input"`` and ``(step, u)`` with attribute ``share``: the share of the token (or
    the mean share over tokens) that function ``u`` receives at that step. An edge
    ``(step-1, u) -> (step, v)`` has ``weight`` = the mean over tokens of ``C[step-1, u] C[step, v]``:
    how much of the token stream passes from ``u`` to ``v``.
    """
    if compat.dim() != 3:
        raise ValueError(
            f"compat must have shape (steps, functions, tokens), got {tuple(compat.shape)}"
        )
    C = compat.detach().float().cpu()
    if token is not None:
        C = C[:, :, token : token + 1]
    steps, U, _ = C.shape
    G = nx.DiGraph()
    G.add_node("input", share=1.0)
    for k in range(steps):
        for u in range(U):
            G.add_node((k, u), share=C[k, u].mean().item())
            if k == 0:
                w = C[0, u].mean().item()
                if w > min_weight:
                    G.add_edge("input", (0, u), weight=w)
                continue
            for v in range(U):
                w = (C[k - 1, v] * C[k, u]).mean().item()
                if w > min_weight:
                    G.add_edge((k - 1, v), (k, u), weight=w)
    return G


def draw_routing(
    compat: Tensor,
    ax=None,
    token: int | None = None,
    step_labels: Sequence[str] | None = None,
    title: str | None = None,
    node_scale: float = 900.0,
    edge_scale: float = 6.0,
):
    """Draw :func:`routing_graph` with steps left to right and functions top to bottom.

    Node area is proportional to the share a function receives, edge width to the flow between
    functions of consecutive steps. Colours identify functions (the same colour at every step:
    shared parameters).
    """
    import matplotlib.pyplot as plt

    G = routing_graph(compat, token)
    steps, U = compat.shape[0], compat.shape[1]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 * (steps + 1), 0.6 * U + 1))
    pos = {"input": (0.0, (U - 1) / 2)}
    pos.update({(k, u): (k + 1.0, U - 1.0 - u) for k in range(steps) for u in range(U)})
    nodes = [n for n in G.nodes if n != "input"]
    colours = [plt.cm.tab10(n[1] % 10) for n in nodes]
    nx.draw_networkx_nodes(G, pos, nodelist=["input"], node_size=200, node_color="0.3", ax=ax)
    nx.draw_networkx_nodes(
        G,
        pos,
        nodelist=nodes,
        node_size=[node_scale * G.nodes[n]["share"] + 10 for n in nodes],
        node_color=colours,
        ax=ax,
    )
    widths = [edge_scale * G.edges[e]["weight"] for e in G.edges]
    nx.draw_networkx_edges(G, pos, width=widths, arrows=False, ax=ax, edge_color="0.4")
    labels = (
        list(step_labels) if step_labels is not None else [f"iter {k + 1}" for k in range(steps)]
    )
    ax.set_xticks(range(steps + 1), ["input", *labels])
    ax.set_yticks(range(U), [f"f{U - 1 - u}" for u in range(U)])
    ax.tick_params(left=True, bottom=True, labelleft=True, labelbottom=True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    return ax


def draw_function_shares(entries: Sequence[dict], ax=None, title: str | None = None):
    """Stacked bars of each function's share of the tokens' routing weight, one bar per function
    iteration of each seed, from :func:`modnets.diagnostics.routing` summaries (``"share"``,
    ``"regime"``, optionally ``"seed"``). Equal segments: uniform routing; one or two segments:
    collapsed.
    """
    import matplotlib.pyplot as plt

    if not entries:
        raise ValueError("entries is empty: give one routing summary per seed")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.45 * sum(len(e["share"]) for e in entries), 3))
    x, ticks, labels = 0.0, [], []
    for e in entries:
        for k, shares in enumerate(e["share"]):
            bottom = 0.0
            for u, share in enumerate(shares):
                ax.bar(
                    x,
                    share,
                    bottom=bottom,
                    color=plt.cm.tab10(u % 10),
                    width=0.8,
                    edgecolor="white",
                    linewidth=0.5,
                )
                bottom += share
            ticks.append(x)
            labels.append(f"i{k + 1}")
            x += 1.0
        ax.text(
            x - (len(e["share"]) + 1) / 2,
            1.02,
            f"seed {e.get('seed', '?')}: {e['regime']}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
        x += 0.6
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set(ylim=(0, 1.12), ylabel="share of routing weight")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, pad=14)
    return ax


def draw_circuit(
    P: Tensor,
    ax=None,
    threshold: float = 0.5,
    num_hubs: int = 5,
    seed: int = 0,
    node_size: float = 40.0,
):
    """Draw a NAC circuit like NAC Fig. 8: an edge where ``P_ij > threshold``, node area by the
    module importance ``q_i = sum_j P_ij`` (App. F) and the ``num_hubs`` most connected modules
    in red. Returns the networkx graph.
    """
    import matplotlib.pyplot as plt

    from modnets.graphs import to_networkx

    if P.dim() != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be a square (U, U) matrix, got {tuple(P.shape)}")
    ax = ax if ax is not None else plt.gca()
    G = to_networkx(P, threshold)
    q = P.detach().float().sum(-1).cpu()
    hubs = set(q.argsort(descending=True)[:num_hubs].tolist())
    pos = nx.spring_layout(G, seed=seed)
    sizes = (node_size * q / q.mean()).tolist()
    colors = ["tab:red" if u in hubs else "tab:blue" for u in G.nodes]
    nx.draw_networkx_edges(G, pos, ax=ax, alpha=0.25, width=0.6)
    nx.draw_networkx_nodes(G, pos, ax=ax, node_size=sizes, node_color=colors, linewidths=0)
    ax.set_axis_off()
    return G
