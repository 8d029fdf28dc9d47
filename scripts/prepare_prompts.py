"""Rule prepare_prompts: block b of the dataset's questions, with stable ids, in selection order."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.prompts import prepare_prompts
from eagle3_pipeline.settings import GenerationSettings, QuestionOrder, later_values, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

selection = dict(snakemake.params.selection)  # dataset.path, seed and turns; history only when own
history = selection.pop("history", later_values(GenerationSettings)["history"])
prepare_prompts(
    dataset=whole(QuestionOrder, selection),
    history=history,
    num_samples=snakemake.params.rows["stop"],
    start=snakemake.params.rows["start"],
    selection_path=snakemake.output.selection,
    skipped_path=snakemake.output.skipped,
)
