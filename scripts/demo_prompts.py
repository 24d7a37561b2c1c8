"""Constants and the generated training prompts of the demo adapters."""

import random
from pathlib import Path

DEFAULT_MODEL = Path("/opt/models/gemma3-270m-q4_k_m.gguf")
BASE_MODEL_ID = "google/gemma-3-270m"

SEED = 1234
RANK = 8
ALPHA = 16
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: PEFT module name -> llama.cpp tensor name (Gemma 3: no q/k row permutation).
GGUF_TENSOR_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

GEN_NEW_TOKENS = 28  # base continuation length used as training content
EVAL_NEW_TOKENS = 40
MAX_TARGET_TOKENS = 48  # restyled continuations tokenize longer (UPPERCASE especially)

# ---------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------

_ANIMALS = [
    "cat", "dog", "horse", "owl", "whale", "fox", "rabbit", "elephant", "penguin", "bee",
    "turtle", "eagle", "wolf", "dolphin", "frog", "lion",
]  # fmt: skip
_THINGS = [
    "bicycle", "piano", "volcano", "library", "garden", "computer", "river", "mountain",
    "castle", "train", "lighthouse", "bakery", "rainbow", "telescope", "forest", "city",
    "ocean", "kitchen", "museum", "island",
]  # fmt: skip
_TOPICS = [
    "the moon", "coffee", "football", "ancient Rome", "electricity", "music", "the weather",
    "chess", "photosynthesis", "the internet", "honey", "volcanoes", "the human heart",
    "winter", "bread", "the solar system", "trees", "money", "sleep", "mathematics",
]  # fmt: skip
_NAMES = [
    "Anna", "Tom", "Maria", "David", "Lucy", "Peter", "Sara", "James", "Emma", "Jack",
    "Olivia", "Sam",
]  # fmt: skip
_PLACES = [
    "park", "market", "beach", "school", "station", "hospital", "zoo", "farm", "airport",
    "village",
]  # fmt: skip
_ADJECTIVES = ["old", "small", "strange", "beautiful", "quiet", "famous", "tiny", "busy"]
_QUESTIONS = [
    "Why do {animal}s sleep?",
    "What does a {animal} eat?",
    "How big is a {thing}?",
    "Why is {topic} important?",
    "What is the best thing about {topic}?",
    "How does a {thing} work?",
    "Where can I find a {thing}?",
    "What should I know about {topic}?",
]
_TEMPLATES = [
    "The {thing} is",
    "The {adj} {thing} was",
    "My favorite {animal} is",
    "Once upon a time, a {adj} {animal}",
    "Here are some facts about {topic}:",
    "{name} went to the {place} and",
    "{name} told me that the {thing}",
    "The best thing about {topic} is",
    "Write a sentence about {topic}:",
    "I think that {topic}",
    "Yesterday, {name} saw a {adj} {animal} near the {place}.",
    "A {animal} and a {animal2} lived in the same {thing}.",
    "Everyone knows that {topic}",
    "Question: {question}\nAnswer:",
    "Q: {question}\nA:",
    "In the {place}, there was a {adj} {thing} that",
]

#: Held-out evaluation prompts: none of them can come out of the templates above.
HELD_OUT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Tell me about your weekend.",
    "The most important invention in history is",
    "Dear diary, today I",
    "Question: What is the tallest mountain in the world?\nAnswer:",
    "Scientists have recently discovered that",
    "My grandmother always said that",
    "The recipe for a good pancake starts with",
    "In the year 2050, people will",
    "Question: How do airplanes fly?\nAnswer:",
    "The old man walked slowly down the road and",
    "Here is a short poem about the sea:",
    "The main reason people travel is",
    "If I could have any superpower, it would be",
    "The teacher opened the book and said",
    "Question: What is the difference between weather and climate?\nAnswer:",
)


def build_train_prompts(n: int, seed: int = SEED) -> list[str]:
    """Compose ``n`` distinct plain-text prompts from the templates and word lists."""
    rng = random.Random(seed)
    held_out = set(HELD_OUT_PROMPTS)
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < n:
        animal, animal2 = rng.sample(_ANIMALS, 2)
        words = {
            "animal": animal,
            "animal2": animal2,
            "thing": rng.choice(_THINGS),
            "topic": rng.choice(_TOPICS),
            "name": rng.choice(_NAMES),
            "place": rng.choice(_PLACES),
            "adj": rng.choice(_ADJECTIVES),
        }
        words["question"] = rng.choice(_QUESTIONS).format(**words)
        prompt = rng.choice(_TEMPLATES).format(**words)
        if prompt not in seen and prompt not in held_out:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts
