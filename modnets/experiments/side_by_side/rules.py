"""The rules that decide this experiment's claims, declared before the numbers they decide and
pinned by the rule-change log (:mod:`modnets.experiments.core.rules`)."""

from modnets.experiments.core.rule import POINTS, Rule
from modnets.experiments.core.rules import declare
from modnets.experiments.side_by_side.config import NAME

RULES = declare(
    NAME,
    [
        Rule(
            id="ours-side-nfm-ood",
            kind="ours",
            text="NFM's promise on a shared task: around the same CNN, NFM generalises better to a digit "
            "count it never saw",
            source="ours (after NFM §4.2)",
            paper="not a paper's number: NFM Table 5 tests it on its own task",
            quantity="NFM(CNN) − CNN exact-match on 3-digit canvases (trained on 1 and 2)",
            test=">",
            threshold=0.0,
            **POINTS,
        ),
        Rule(
            id="ours-side-ni-adapts",
            kind="ours",
            text="NI's promise on a shared task: from a few examples of a new domain, the NI adapts "
            "better than a ViT of the same size",
            source="ours (after NI §4.2)",
            paper="not a paper's number: NI Fig. 5a tests it on its own task",
            quantity="NI − ViT K-MNIST exact-match after finetuning on a few canvases",
            test=">",
            threshold=0.0,
            **POINTS,
        ),
        Rule(
            id="ours-side-nac-drops",
            kind="ours",
            text="NAC's promise on a shared task: with 80 % of its modules dropped, the NAC keeps more "
            "of its accuracy than a Perceiver IO of the same size with 80 % of its latents dropped",
            source="ours (after NAC §4, Fig. 5a)",
            paper="not a paper's number: NAC Fig. 5a tests it on its own task",
            quantity="(NAC − Perceiver IO) accuracy kept with 80 % dropped",
            test=">",
            threshold=0.0,
            **POINTS,
        ),
    ],
)
