"""The rules that decide this experiment's claims, declared before the numbers they decide and
pinned by the rule-change log (:mod:`modnets.experiments.core.rules`)."""

from modnets.experiments.core.rule import POINTS, Rule
from modnets.experiments.core.rules import declare
from modnets.experiments.stacked_mnist.config import NAME

RULES = declare(
    NAME,
    [
        *[
            Rule(
                id=f"table5-{c}",
                kind="paper",
                text=f"NFM(CNN) beats the CNN on {c} digits (never trained on)",
                source="NFM Table 5",
                paper=f"{nfm:.2f} vs {cnn:.2f} (trained on 1 and 3 digits)",
                quantity=f"NFM(CNN) − CNN exact-match accuracy on {c} digits",
                test=">",
                threshold=0.0,
                paper_effect=(nfm - cnn) / 100,
                basis=f"NFM Table 5: {nfm:.2f} − {cnn:.2f}",
                **POINTS,
            )
            for c, nfm, cnn in ((2, 88.36, 76.7), (4, 66.12, 62.57), (5, 29.48, 24.27))
        ],
        Rule(
            id="table5-interaction",
            kind="paper",
            text="NFM helps where 'the train and test set differ systematically': its gain on held-out "
            "counts exceeds its gain on trained ones",
            source="NFM Table 5, §4.2",
            paper="mean gain 6.81 pts on 2, 4, 5 digits vs −0.05 on 1, 3",
            quantity="mean gain on held-out counts − mean gain on trained counts",
            test=">",
            threshold=0.0,
            paper_effect=((88.36 - 76.7) + (66.12 - 62.57) + (29.48 - 24.27)) / 300
            - ((99.23 - 99.27) + (87.78 - 87.83)) / 200,
            basis="NFM Table 5 (trained on 1 and 3 digits)",
            **POINTS,
        ),
    ],
)
