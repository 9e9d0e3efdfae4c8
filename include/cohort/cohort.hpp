// cohort for CPU users: the Trainer, the Mirrored strategy and every optimizer.
#pragma once

#include "cohort/collective/local.hpp"
#include "cohort/core/dataset.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "cohort/trainer.hpp"
