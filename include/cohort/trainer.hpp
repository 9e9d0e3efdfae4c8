// The include users write for the Trainer: its room is include/cohort/trainer/ (trainer.hpp there
// is the face and its manual).
#pragma once

#include "cohort/trainer/trainer.hpp"
