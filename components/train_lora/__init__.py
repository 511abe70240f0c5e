from components.train_lora.component import train_lora

__all__ = ["train_lora"]
