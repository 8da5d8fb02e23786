"""A first look at fastdeploy on the embedded SmolLM2-135M-Instruct, a small model (135 million
parameters) that runs on any laptop CPU: chat, text completion, then sampling.

`make demo` sets up .venv and runs this file; afterwards `.venv/bin/python examples/offline_inference.py`.
"""

from fastdeploy import LLM, SamplingParams

llm = LLM(model="SmolLM2-135M-Instruct", max_model_len=8192)

# 1. Chat (LLM.chat): each conversation is rendered with the model's chat template.
#    temperature=0 is greedy decoding: the most likely token at every step, so the answer is the
#    same on every run. A small model answers short questions best this way.
greedy = SamplingParams(temperature=0, max_tokens=64)
questions = ["What is the capital of France?", "What is the boiling point of water in Celsius?"]
outputs = llm.chat([[{"role": "user", "content": question}] for question in questions], greedy)
for question, output in zip(questions, outputs, strict=True):
    print(f"User: {question}\nAssistant: {output.outputs.text}\n")

# 2. Text completion (LLM.generate): the model continues the prompt as written, without a chat
#    template, until it has written max_tokens tokens, produces its end-of-text token, or writes
#    a stop string (here the end of the line, which is cut from the text).
prompts = ["The capital of France is", "The first man on the moon was"]
for output in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, stop=["\n"])):
    print(f"Prompt: {output.prompt!r}\nCompletion: {output.outputs.text!r}\n")

# 3. Sampling: with temperature > 0 each token is drawn at random from the model's probabilities
#    (top_p=0.95 keeps only the most likely tokens that together make up 95% of them), so runs
#    and the n samples of one request differ. That gives variety for stories, and more mistakes
#    from a small model: use greedy decoding for facts. seed= makes a sampled run repeatable.
story = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48, n=2, seed=0)
output = llm.generate("Once upon a time, in a small village,", story)[0]
for index, sample in enumerate(output.outputs):
    print(f"Sample {index + 1}: {output.prompt}{sample.text}\n")
